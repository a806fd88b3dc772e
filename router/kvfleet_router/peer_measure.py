"""What an endpoint's scrapes say about peer prefix fetches: bandwidth and KV block size.

Pure bookkeeping over successive `/metrics` scrapes of a kvfleet engine (rule 8 of
`contract.metrics_text`):

- bandwidth (bytes/s) that its peers delivered: the delta of
  `kvfleet:peer_fetch_bytes_total` over the delta of `kvfleet:peer_fetch_seconds`' sum
  between two scrapes, averaged in an EWMA; a counter that went down (the engine
  restarted) starts a new baseline and teaches nothing;
- KV bytes per block: `kvfleet:peer_export_bytes_total / kvfleet:peer_export_blocks_total`
  (exact: every exported block has the same geometry), else the importing side's
  `peer_fetch_bytes / peer_fetch_blocks` (high when some fetched blocks were cached already).

Until measured, readers fall back to `kv_sharing`'s priors (peer_hint.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvfleet_router.ewma import Ewma


@dataclass(slots=True)
class PeerTotals:
    """The peer-sharing counters of one scrape; None where the engine does not expose it."""

    fetch_bytes: float | None = None
    fetch_blocks: float | None = None
    fetch_seconds: float | None = None  # the histogram's sum
    export_bytes: float | None = None
    export_blocks: float | None = None


@dataclass(slots=True)
class PeerMeasure:
    bandwidth: Ewma = field(default_factory=Ewma)  # bytes/s its peer fetches achieved
    bytes_per_block: float | None = None
    last: PeerTotals | None = None

    def observe(self, totals: PeerTotals) -> None:
        prev, self.last = self.last, totals
        if totals.export_bytes and totals.export_blocks:
            self.bytes_per_block = totals.export_bytes / totals.export_blocks
        elif totals.fetch_bytes and totals.fetch_blocks and self.bytes_per_block is None:
            self.bytes_per_block = totals.fetch_bytes / totals.fetch_blocks
        if prev is None or None in (prev.fetch_bytes, prev.fetch_seconds,
                                     totals.fetch_bytes, totals.fetch_seconds):
            return
        d_bytes = totals.fetch_bytes - prev.fetch_bytes  # type: ignore[operator]
        d_seconds = totals.fetch_seconds - prev.fetch_seconds  # type: ignore[operator]
        if d_bytes > 0 and d_seconds > 0:
            self.bandwidth.add(d_bytes / d_seconds)
