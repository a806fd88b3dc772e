"""What an endpoint's scrapes say about peer prefix fetches: bandwidth and KV block size.

Pure bookkeeping over successive `/metrics` scrapes of a kvfleet engine (rule 8 of
`contract.metrics_text`):

- bandwidth (bytes/s) that its peers delivered: the delta of
  `kvfleet:peer_fetch_bytes_total` over the delta of `kvfleet:peer_fetch_seconds`' sum
  between two scrapes, averaged in an EWMA; a counter that went down (the engine
  restarted) starts a new baseline and teaches nothing;
- an upper bound on that bandwidth from fetches that timed out: the delta of
  `kvfleet:peer_fetch_timeout_bytes_asked_total` over that of
  `kvfleet:peer_fetch_timeout_seconds_total`. A fetch that timed out moved less than it
  asked for in the time it waited, so the link is at most that fast; when the estimate is
  unknown or above the bound, the bound is fed into the EWMA. Without it a link too slow
  for any fetch to finish would never be measured, and the prior would keep hints coming;
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
    timeout_bytes: float | None = None  # bytes asked for by fetches that timed out
    timeout_seconds: float | None = None  # seconds those fetches waited


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
        if prev is None:
            return
        rate = _rate(prev.fetch_bytes, totals.fetch_bytes, prev.fetch_seconds,
                     totals.fetch_seconds)
        if rate is not None:
            self.bandwidth.add(rate)
        bound = _rate(prev.timeout_bytes, totals.timeout_bytes, prev.timeout_seconds,
                      totals.timeout_seconds)
        # A timed-out fetch proves the link is at most `bound` fast: lower an estimate
        # above it (or set an unknown one), never raise one below it.
        if bound is not None and (self.bandwidth.value is None or self.bandwidth.value > bound):
            self.bandwidth.add(bound)


def _rate(bytes_before: float | None, bytes_now: float | None, seconds_before: float | None,
          seconds_now: float | None) -> float | None:
    """Bytes per second between two scrapes of a (bytes, seconds) counter pair; None when
    either is missing, nothing moved, or a counter went down (a restart: new baseline)."""
    if bytes_before is None or bytes_now is None or seconds_before is None \
            or seconds_now is None:
        return None
    d_bytes, d_seconds = bytes_now - bytes_before, seconds_now - seconds_before
    return d_bytes / d_seconds if d_bytes > 0 and d_seconds > 0 else None
