"""Peer prefix fetches in virtual time (`routing.kvSharing`): KV moved instead of recomputed.

With `kv_sharing.enabled` in the pushed router config, the fleet's dispatch asks for a
hint after each decision through the router's own plan (`kvfleet_router.pd_plan.peer_hint`,
which the dispatcher's `with_peer_hint` calls too; `RouterCore.peer_hint` and
`kvfleet_router.peer_hint.decide_peer_hint` decide). An attached
hint names a peer and the engine hashes of the prompt's leading blocks; then, as the
server's `peer_fetch.py` does before the request is added:

1. the target asks only for the hinted hashes that equal the prompt's own chained
   hashes (`prefix_share.chained_hashes`, `num_agreeing`); none agree: `mismatch`;
2. `latency_s` later the peer's real engine answers (`LLMEngine.export_prefix`: what it
   caches *then*, so blocks it evicted meanwhile are not sent; none left: `miss`; a peer
   that is gone: `unreachable`);
3. the exported blocks travel, `bytes / bytes_per_s`, where bytes are the model's KV
   (`handoff.kv_bytes_per_token` of the profile) for the blocks sent; a fetch whose
   latency plus transfer exceeds the fetch's limit (the engine's timeout, or the hint's
   shorter `timeout_s`, as in the engine) gives up at that limit (`timeout`) and the
   request computes its prompt;
4. the request enters the target's engine with `add_request(prefix_kv=...)`: the engine's
   own install path (`core.prefix_share.install`) writes the blocks, registers them as
   cached (BlockStored events reach the router's precise index) and pins them until
   admission; the outcome is the server's (`peer_fetch.installed_outcome`: `hit`,
   `partial`, `no_room`, `skipped`).

    seconds = latency_s + blocks_sent * block_size * bytes_per_token / bytes_per_s

The request waits for all of it before it enters the engine, and its TTFT counts from its
arrival. The peer's read and the target's write cost no GPU time here. Each replica's
counters (`totals`) are the ones a real engine exports at /metrics
(`kvfleet:peer_fetch_bytes_total`, the fetch-seconds sum, `kvfleet:peer_export_*`, and
for a timed-out fetch `kvfleet:peer_fetch_timeout_{bytes_asked,seconds}_total`: the bytes
of every block it asked for and the seconds it waited), and the router's scrapes feed them
to `PeerMeasure`, so the router's bandwidth (an upper bound from timeouts included) and
bytes per block are measured the same way as in a live fleet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.prefix_share import (
    PrefixInstall,
    chained_hashes,
    num_agreeing,
    num_usable_blocks,
)
from kvfleet_engine.core.sequence import PrefixKV
from kvfleet_router.peer_measure import PeerTotals

from kvfleet_sim.handoff import Handoff

DEFAULT_TIMEOUT_S = 5.0  # the engine's `peer_fetch_timeout_s` default (server/state.py)
LOST = "lost"  # the target replica went away while the fetch ran (the request fails)


@dataclass(slots=True)
class Fetch:
    """One request's fetch in flight."""

    target: str  # the replica that will serve the request
    peer: str  # the replica named in the hint ("" when its URL is unknown)
    asked: list[int]  # engine hashes asked for (those agreeing with the prompt)
    started: float
    timeout_s: float = DEFAULT_TIMEOUT_S  # the engine's, or the hint's when shorter
    prefix: PrefixKV | None = None  # the blocks once the peer answered
    num_bytes: int = 0  # modelled KV bytes on the wire
    outcome: str = ""  # set when the fetch failed before the install


@dataclass(slots=True)
class ReplicaTotals:
    """One replica's peer counters, as its /metrics would show them."""

    fetch_bytes: int = 0
    fetch_blocks: int = 0
    fetch_seconds: float = 0.0
    export_bytes: int = 0
    export_blocks: int = 0
    timeout_bytes: int = 0  # bytes asked for by fetches that timed out
    timeout_seconds: float = 0.0  # seconds they waited

    def scrape(self) -> PeerTotals:
        return PeerTotals(float(self.fetch_bytes), float(self.fetch_blocks),
                          self.fetch_seconds, float(self.export_bytes),
                          float(self.export_blocks), float(self.timeout_bytes),
                          self.timeout_seconds)


@dataclass(slots=True)
class PeerStats:
    """Fleet totals: hints by reason, fetches by outcome, what moved."""

    hints: Counter[str] = field(default_factory=Counter)
    # "<the policy's decision reason>/<hint reason>": "balanced/..." are the requests the
    # imbalance guard sent by load alone
    by_decision: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[str] = field(default_factory=Counter)
    num_blocks: int = 0  # fetched blocks written into a target's cache
    num_tokens: int = 0  # prompt tokens those blocks hold (the fetched prefix reuse)
    num_bytes: int = 0  # modelled KV bytes that travelled (also for blocks not installed)
    fetch_seconds: float = 0.0  # hint to blocks in hand, summed

    def copy(self) -> PeerStats:
        return PeerStats(Counter(self.hints), Counter(self.by_decision), Counter(self.outcomes),
                         self.num_blocks, self.num_tokens, self.num_bytes, self.fetch_seconds)

    def minus(self, start: PeerStats) -> PeerStats:
        return PeerStats(self.hints - start.hints, self.by_decision - start.by_decision,
                         self.outcomes - start.outcomes,
                         self.num_blocks - start.num_blocks, self.num_tokens - start.num_tokens,
                         self.num_bytes - start.num_bytes,
                         self.fetch_seconds - start.fetch_seconds)


def asked_hashes(prompt: Sequence[int], hint: pp.PeerPrefix, block_size: int) -> list[int]:
    """The hinted hashes the target asks for: the leading run equal to the prompt's own."""
    n = min(len(hint.block_hashes), num_usable_blocks(len(prompt), block_size))
    own = chained_hashes(prompt, block_size, n)
    return own[:num_agreeing(own, hint.block_hashes)]


def installed_outcome(installed: PrefixInstall, num_asked: int) -> str:
    """The server's outcome once the engine took (or refused) the blocks."""
    if installed.is_no_room:
        return pp.OUTCOME_NO_ROOM
    if installed.num_blocks == 0:
        return pp.OUTCOME_SKIPPED
    return pp.OUTCOME_HIT if installed.num_blocks >= num_asked else pp.OUTCOME_PARTIAL


class PeerFetches:
    """The fleet's fetches in flight and their counters; the fleet owns time and events."""

    def __init__(self, link: Handoff, block_size: int,
                 timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.link = link
        self.block_size = block_size
        self.timeout_s = timeout_s
        self.in_flight: dict[str, Fetch] = {}
        self.stats = PeerStats()
        self.totals: dict[str, ReplicaTotals] = {}

    def replica_totals(self, name: str) -> ReplicaTotals:
        if (t := self.totals.get(name)) is None:
            t = self.totals[name] = ReplicaTotals()
        return t

    def start(self, rid: str, prompt: Sequence[int], target: str, peer: str,
              hint: pp.PeerPrefix, t: float) -> float | None:
        """Begin a fetch; the time the peer answers, or None when nothing is asked (the
        hint disagrees with the prompt: the request goes to the target now)."""
        asked = asked_hashes(prompt, hint, self.block_size)
        if not asked:
            self.stats.outcomes[pp.OUTCOME_MISMATCH] += 1
            return None
        f = self.in_flight[rid] = Fetch(target, peer, asked, t,
                                        hint.fetch_timeout_s(self.timeout_s))
        return t + min(self.link.latency_s, f.timeout_s)

    def export(self, rid: str, peer: LLMEngine | None, t: float) -> float:
        """The peer reads what it still caches; the time the blocks (or the give-up) land."""
        f = self.in_flight[rid]
        if self.link.latency_s > f.timeout_s:  # given up before the peer could answer
            f.outcome = pp.OUTCOME_TIMEOUT
            return t
        if peer is None:
            f.outcome = pp.OUTCOME_UNREACHABLE
            return t
        exported = peer.export_prefix(f.asked, len(f.asked))
        n = len(exported.block_hashes)
        if n == 0:
            f.outcome = pp.OUTCOME_MISS
            return t
        f.num_bytes = self.kv_bytes(n)
        peer_totals = self.replica_totals(f.peer)
        peer_totals.export_bytes += f.num_bytes
        peer_totals.export_blocks += n
        done = t + f.num_bytes / self.link.bytes_per_s
        if done - f.started > f.timeout_s:
            f.outcome = pp.OUTCOME_TIMEOUT
            return f.started + f.timeout_s
        f.prefix = PrefixKV(list(exported.block_hashes), exported.data)
        return done

    def landed(self, rid: str, t: float) -> Fetch:
        """The fetch is over (blocks in hand, or given up); the caller adds the request."""
        f = self.in_flight.pop(rid)
        seconds = t - f.started
        self.stats.fetch_seconds += seconds
        self.stats.num_bytes += f.num_bytes if f.prefix is not None else 0
        if f.prefix is not None or f.outcome == pp.OUTCOME_MISS:  # as the server observes
            mine = self.replica_totals(f.target)
            mine.fetch_bytes += f.num_bytes if f.prefix is not None else 0
            mine.fetch_seconds += seconds
        elif f.outcome == pp.OUTCOME_TIMEOUT:  # as the server: every block asked, time waited
            mine = self.replica_totals(f.target)
            mine.timeout_bytes += self.kv_bytes(len(f.asked))
            mine.timeout_seconds += seconds
        return f

    def kv_bytes(self, num_blocks: int) -> int:
        """The modelled KV payload of `num_blocks` blocks."""
        return num_blocks * self.block_size * self.link.bytes_per_token

    def record(self, f: Fetch, installed: PrefixInstall | None) -> str:
        """Count the fetch's outcome; `installed` is the engine's answer (None: no install
        was tried, `f.outcome` says why, or the target was gone: `lost`)."""
        if installed is None:
            outcome = f.outcome or LOST
        else:
            outcome = installed_outcome(installed, len(f.asked))
            if outcome in (pp.OUTCOME_HIT, pp.OUTCOME_PARTIAL):
                self.stats.num_blocks += installed.num_written
                self.stats.num_tokens += installed.num_written * self.block_size
                self.replica_totals(f.target).fetch_blocks += installed.num_written
        self.stats.outcomes[outcome] += 1
        return outcome
