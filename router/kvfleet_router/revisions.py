"""The router's side of a rollout: split new requests between engine revisions, and measure
each revision's answers for the operator's analysis. Pure (no I/O, no clocks).

`RevisionSplit` follows the config's `revisions.weights` (config.py). Each new request is
assigned one revision by smooth weighted round-robin (nginx's): deterministic, so over any
N consecutive assignments each revision gets within 2 of `weight * N / total` (within 1
counted from a config change), never a random walk. A request with a session key (the
`session.header`, or the body's `user`) keeps the revision it first got while that revision
still has weight > 0 (an LRU table of `MAX_SESSIONS` keys); such requests do not advance
the round-robin. The dispatcher then routes among that revision's endpoints only, and
falls back, in order, to each other weighted revision (heaviest first) and last to
endpoints of no weighted revision (weight 0, unlisted, or none) when the assigned one has
no endpoint that may take the request now (none ready, or all saturated), so the split
never fails or queues a request that another revision could serve (a P/D decode leg that
falls back leaves its prefill's KV behind: pd.py). Without `revisions` every endpoint
serves as before.

`RevisionMeter` holds one `MeteredCounts` (revision_stats.RevisionCounts plus the sums a
Prometheus histogram needs) per revision an upstream attempt went to; the forwarder and
the EPP front fill them, GET /admin/config answers them under `revisions`, and
`RevisionCollector` exports them:

    kvfleet_router_revision_requests_total{revision,outcome="ok"|"error"}
    kvfleet_router_revision_ttft_seconds{revision}   (histogram, revision_stats buckets)
    kvfleet_router_revision_itl_seconds{revision}
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from kvfleet_router.config import RevisionsConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.revision_stats import LATENCY_BUCKETS_S, RevisionCounts, bucket_of

MAX_SESSIONS = 100_000  # session -> revision entries kept (least recently used dropped)


class RevisionSplit:
    def __init__(self, max_sessions: int = MAX_SESSIONS) -> None:
        self.max_sessions = max_sessions
        self.weights: dict[str, int] = {}
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self._live: list[str] = []  # weight > 0, config order (ties go to the first)
        self._total = 0
        self._current: dict[str, int] = {}
        # endpoint lists in the order to try, per revision, for one registry list (the
        # registry swaps its list on every config, never mutates it)
        self._pools: dict[str, list[list[EndpointState]]] = {}
        self._pools_of: list[EndpointState] | None = None
        # told of each new session placement (exchange.py shares them with peers)
        self.on_assign: Callable[[str, str], None] | None = None

    def configure(self, cfg: RevisionsConfig | None) -> None:
        weights = dict(cfg.weights) if cfg is not None else {}
        self._pools_of = None
        if weights == self.weights:
            return  # a push of other settings keeps the round-robin's place
        self.weights = weights
        self._live = [r for r, w in weights.items() if w > 0]
        self._total = sum(weights.values())
        self._current = dict.fromkeys(self._live, 0)
        if not weights:
            self.sessions.clear()

    @property
    def is_active(self) -> bool:
        return bool(self.weights)

    def assign(self, session_key: str | None = None) -> str | None:
        """The revision a new request goes to; None without a split."""
        if not self.weights:
            return None
        sessions = self.sessions
        if session_key is not None:
            kept = sessions.get(session_key)
            if kept is not None and self.weights.get(kept, 0) > 0:
                sessions.move_to_end(session_key)
                return kept
        current, best = self._current, self._live[0]
        for r in self._live:
            current[r] += self.weights[r]
            if current[r] > current[best]:
                best = r
        current[best] -= self._total
        if session_key is not None:
            self._place(session_key, best)
            if self.on_assign is not None:
                self.on_assign(session_key, best)
        return best

    def _place(self, session_key: str, revision: str) -> None:
        sessions = self.sessions
        sessions[session_key] = revision
        sessions.move_to_end(session_key)
        if len(sessions) > self.max_sessions:
            sessions.popitem(last=False)

    def adopt(self, session_key: str, revision: str) -> None:
        """A placement another router replica made (exchange.py): taken unless this one
        placed the session itself, so a session keeps one revision pool-wide."""
        if session_key not in self.sessions and revision in self.weights:
            self._place(session_key, revision)

    def pools(self, endpoints: list[EndpointState],
              revision: str | None) -> list[list[EndpointState]]:
        """The endpoint sets to try in order for a request of `revision` (module
        docstring); `[endpoints]` when there is nothing to split."""
        if revision is None or not self.weights:
            return [endpoints]
        if self._pools_of is not endpoints:
            self._pools, self._pools_of = {}, endpoints
        got = self._pools.get(revision)
        if got is None:
            got = self._pools[revision] = self._build(endpoints, revision)
        return got

    def _build(self, endpoints: list[EndpointState], revision: str) -> list[list[EndpointState]]:
        own = [e for e in endpoints if e.revision == revision]
        others = sorted((r for r in self._live if r != revision),
                        key=lambda r: -self.weights[r])
        out = [own, *([e for e in endpoints if e.revision == r] for r in others)]
        rest = [e for e in endpoints if self.weights.get(e.revision, 0) <= 0]
        return [p for p in (*out, rest) if p]


@dataclass(slots=True)
class MeteredCounts(RevisionCounts):
    """RevisionCounts plus the sums of what the histograms observed (Prometheus' _sum)."""

    ttft_sum: float = 0.0
    itl_sum: float = 0.0

    def observe_ttft(self, seconds: float) -> None:
        self.ttft[bucket_of(seconds)] += 1
        self.ttft_sum += seconds

    def observe_itl(self, seconds: float) -> None:
        self.itl[bucket_of(seconds)] += 1
        self.itl_sum += seconds


MAX_DEPARTED_REVISIONS = 4  # counters kept after their revision left the config


class RevisionMeter:
    """Counters per revision since the router started (never reset while a revision is in
    the config). A revision that left it (a rolled-back canary, a replaced stable) keeps its
    counters for the last `MAX_DEPARTED_REVISIONS` such revisions, so what it did to
    clients stays readable after the rollout is over; older ones are forgotten."""

    def __init__(self) -> None:
        self.counts: dict[str, MeteredCounts] = {}
        self.departed: list[str] = []  # oldest first

    def of(self, revision: str) -> MeteredCounts | None:
        """Where to count an attempt on an endpoint of `revision`; None for "" (no
        revision: not counted)."""
        if not revision:
            return None
        got = self.counts.get(revision)
        if got is None:
            got = self.counts[revision] = MeteredCounts()
        return got

    def keep_only(self, revisions: set[str]) -> None:
        """`revisions` are the config's now: the others become departed (bounded)."""
        self.departed = [r for r in self.departed if r not in revisions and r in self.counts]
        self.departed += [r for r in self.counts if r not in revisions
                          and r not in self.departed]  # fmt: skip
        while len(self.departed) > MAX_DEPARTED_REVISIONS:
            del self.counts[self.departed.pop(0)]

    def to_dict(self) -> dict[str, dict[str, object]]:
        return {r: c.to_dict() for r, c in sorted(self.counts.items())}


def _buckets(counts: list[int]) -> list[tuple[str, float]]:
    out, total = [], 0
    for bound, n in zip((*LATENCY_BUCKETS_S, float("inf")), counts, strict=True):
        total += n
        out.append(("+Inf" if bound == float("inf") else repr(bound), float(total)))
    return out


class RevisionCollector(Collector):
    """The meter's counters as Prometheus series, read at scrape time (the request path
    only bumps integers)."""

    def __init__(self, meter: RevisionMeter) -> None:
        self.meter = meter

    def collect(self):  # type: ignore[no-untyped-def]
        requests = CounterMetricFamily("kvfleet_router_revision_requests",
                                       "upstream attempts per engine revision and outcome",
                                       labels=["revision", "outcome"])
        ttft = HistogramMetricFamily("kvfleet_router_revision_ttft_seconds",
                                     "time to first token per engine revision",
                                     labels=["revision"])
        itl = HistogramMetricFamily("kvfleet_router_revision_itl_seconds",
                                    "gaps between streamed chunks per engine revision",
                                    labels=["revision"])
        for r, c in sorted(self.meter.counts.items()):
            requests.add_metric([r, "ok"], c.requests - c.errors)
            requests.add_metric([r, "error"], c.errors)
            ttft.add_metric([r], _buckets(c.ttft), c.ttft_sum)
            itl.add_metric([r], _buckets(c.itl), c.itl_sum)
        yield requests
        yield ttft
        yield itl
