"""Engine signals: parse `/metrics`, keep a short scrape log, aggregate per role over a window.

Public API (all pure):

- `parse_metrics(text) -> ReplicaSample`: Prometheus text from a vLLM or kvfleet engine
  into one typed sample, read by the contract's one `/metrics` parser
  (`kvfleet_engine.contract.read_metrics`; current vLLM v1 names win over the older ones in
  `contract.LEGACY_NAMES`). Raises `MetricsParseError` when no core gauge is usable, or
  when the scrape is garbage (`implausible`: a negative, huge or out-of-range figure, a
  core gauge exposed with only NaN/Inf), so the replica is unknown, never idle.
- `ScrapeLog`: per-replica history of `Scrape`s (a sample or a failure, stamped with the
  caller's clock). `add`, `forget`, `prune`. It is plain data; no clock inside.
- `aggregate(log, roles, now, window_s, stale_after_s, num_held_requests=0,
  expected_roles=()) -> Signals`:
  per-role `RoleSignals` over `[now - window_s, now]`: waiting/running (window mean,
  summed over replicas), KV usage mean and max, waiting prompt tokens, TTFT/ITL p90 from
  histogram deltas, preemptions/s, request rate, prompt tokens/s (all and uncached).
  A metric a replica does not export is unknown, never 0: `kvfleet:num_waiting_prompt_tokens`
  (absent on vLLM) is then derived from vLLM's own series (`backlog_from`): queued
  requests x their mean prompt length (`vllm:prompt_tokens_total` over requests, in the
  window, else since start) x the uncached fraction (1 - prefix-cache hits/queries). With
  nothing to derive it from it stays None and the autoscaler says so.
  A replica whose newest scrape failed or is older than `stale_after_s` is *unknown*:
  it is counted in `num_unknown` and contributes nothing, so it never looks idle.
  `perf_models` (role -> the router's perf-model fit) lands on each role's `perf`.
- `parse_router_perf_models(text)` / `combine_perf_models(parts)`: the routers' exported
  perf-model weights (`kvfleet_router_perf_model_coefficient{role,target,feature}`,
  `kvfleet_router_perf_model_evidence` and the recent prompts,
  `kvfleet_router_perf_model_prompt_ktokens{role,stat}`) back into `RoleCoefficients`,
  and several routers' fits as one (each weight and prompt statistic averaged, weighted by
  the evidence behind it).

The I/O that fills a `ScrapeLog` (scraping `/metrics`, asking Prometheus) lives in the
metrics-source port, `kvfleet_operator.runtimes.metrics_sources`.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvfleet_engine import contract as c
from kvfleet_engine.contract import Buckets  # (upper bound `le`, cumulative count), by le
from kvfleet_router.perf_model import (
    PROMPT_STATS,
    TPOT_FEATURES,
    TTFT_FEATURES,
    RoleCoefficients,
)


class MetricsParseError(ValueError):
    """The scraped body is not Prometheus text exposition."""


@dataclass(slots=True)
class ReplicaSample:
    """What one scrape of one replica said. Counters are raw totals since process start."""

    num_running: float = 0.0
    num_waiting: float = 0.0
    kv_usage: float = 0.0  # 0-1 fraction
    num_waiting_prompt_tokens: float | None = None  # None: not exported (vLLM)
    num_preemptions: float = 0.0
    num_prompt_tokens: float = 0.0
    num_generation_tokens: float = 0.0
    num_prefix_queries: float = 0.0
    num_prefix_hits: float = 0.0
    ttft: Buckets = ()
    itl: Buckets = ()  # one sample per gap between tokens
    tpot: Buckets = ()  # one sample per finished request: its mean time per output token
    queue_time: Buckets = ()  # arrival to first scheduling, observed as requests finish
    role: str | None = None  # from kvfleet:role, when the engine exposes it
    is_draining: bool = False

    @property
    def num_requests(self) -> float:
        """Requests that reached their first token (the TTFT histogram's count)."""
        return self.ttft[-1][1] if self.ttft else 0.0


@dataclass(slots=True)
class Scrape:
    """One scrape attempt at time `t` (the caller's clock, seconds)."""

    t: float
    sample: ReplicaSample | None  # None when the scrape failed
    error: str = ""


_GAUGES = {
    c.NUM_REQUESTS_RUNNING: "num_running",
    c.NUM_REQUESTS_WAITING: "num_waiting",
    c.KV_CACHE_USAGE_PERC: "kv_usage",
    c.NUM_WAITING_PROMPT_TOKENS: "num_waiting_prompt_tokens",
}
_COUNTERS = {
    c.NUM_PREEMPTIONS: "num_preemptions",
    c.PROMPT_TOKENS: "num_prompt_tokens",
    c.GENERATION_TOKENS: "num_generation_tokens",
    c.PREFIX_CACHE_QUERIES: "num_prefix_queries",
    c.PREFIX_CACHE_HITS: "num_prefix_hits",
}
_HISTOGRAMS = {c.TIME_TO_FIRST_TOKEN: "ttft", c.INTER_TOKEN_LATENCY: "itl",
               c.REQUEST_TIME_PER_OUTPUT_TOKEN: "tpot",
               c.REQUEST_QUEUE_TIME: "queue_time"}


def parse_metrics(text: str) -> ReplicaSample:
    """One `/metrics` body through the contract's reader (`kvfleet_engine.contract`, whose
    docstring has the rules: bad lines skipped and counted, current names over legacy ones,
    label sets summed, KV usage averaged). A body with no usable core gauge raises
    MetricsParseError, so its scrape fails and the replica is unknown, never idle."""
    m = c.read_metrics(text)
    if not m.is_usable:
        detail = f"; first bad line: {m.first_bad_line[:80]!r}" if m.num_bad_lines else ""
        raise MetricsParseError(
            f"no running/waiting/KV-usage gauge in the scrape ({m.num_bad_lines} bad lines"
            f"{detail})"
        )
    sample = ReplicaSample(role=m.role, is_draining=m.is_draining)
    for name, attr in _GAUGES.items():
        if name in m.gauges:
            setattr(sample, attr, m.gauges[name])
    for name, attr in _COUNTERS.items():
        if name in m.counters:
            setattr(sample, attr, m.counters[name])
    for name, attr in _HISTOGRAMS.items():
        if name in m.histograms:
            setattr(sample, attr, m.histograms[name])
    why = implausible(sample) or _core_gauge_without_figure(text, m.gauges)
    if why:
        raise MetricsParseError(f"implausible scrape: {why}")
    return sample


# What no engine can report: a scrape saying so is garbage, read as unknown (never idle).
MAX_PLAUSIBLE_REQUESTS = 1e6  # running or waiting on one replica
MAX_PLAUSIBLE_TOKENS = 1e12  # prompt tokens queued on one replica
MAX_PLAUSIBLE_COUNT = float(2**53)  # a counter or bucket past this has lost integer precision
_CORE_GAUGE_LINES = (*c.CORE_GAUGES,
                     *(old for old, new in c.LEGACY_NAMES.items() if new in c.CORE_GAUGES))


def implausible(sample: ReplicaSample) -> str:
    """Why `sample` cannot be a real engine's reading (a negative, huge or out-of-range
    figure), or "" when it can. Pure; `parse_metrics` refuses such a scrape."""
    gauges = {"running": (sample.num_running, MAX_PLAUSIBLE_REQUESTS),
              "waiting": (sample.num_waiting, MAX_PLAUSIBLE_REQUESTS),
              "KV usage": (sample.kv_usage, 1.0)}  # fmt: skip
    if sample.num_waiting_prompt_tokens is not None:
        gauges["waiting prompt tokens"] = (sample.num_waiting_prompt_tokens,
                                           MAX_PLAUSIBLE_TOKENS)  # fmt: skip
    for what, (value, limit) in gauges.items():
        if not 0.0 <= value <= limit:
            return f"{what} {value!r} outside [0, {limit:g}]"
    for attr in _COUNTERS.values():
        value = getattr(sample, attr)
        if not 0.0 <= value <= MAX_PLAUSIBLE_COUNT:
            return f"counter {attr} {value!r} outside [0, 2^53]"
    for attr in _HISTOGRAMS.values():
        for le, count in getattr(sample, attr):
            if not 0.0 <= count <= MAX_PLAUSIBLE_COUNT:
                return f"{attr} bucket le={le:g} count {count!r} outside [0, 2^53]"
    return ""


def _core_gauge_without_figure(text: str, gauges: Mapping[str, float]) -> str:
    """A core gauge the engine exposes with no finite value (only NaN or Inf): the reader
    leaves it out, so waiting=NaN beside running=0 would otherwise read as idle. (A gauge
    that is not exposed at all is simply not exported; one finite label set is a figure.)"""
    for x in c.parse_text(text, only=_CORE_GAUGE_LINES).samples:
        family = c.LEGACY_NAMES.get(x.name, x.name)
        if family not in gauges:
            return f"{x.name} is {x.value!r}"
    return ""


@dataclass(slots=True)
class ScrapeLog:
    """Recent scrapes per replica. The runtime adds; `aggregate` reads."""

    scrapes: dict[str, deque[Scrape]] = field(default_factory=dict)

    def add(self, replica: str, scrape: Scrape) -> None:
        self.scrapes.setdefault(replica, deque()).append(scrape)

    def forget(self, replica: str) -> None:
        self.scrapes.pop(replica, None)

    def prune(self, now: float, keep_s: float) -> None:
        """Drop scrapes older than keep_s, but keep one baseline before the cutoff."""
        for log in self.scrapes.values():
            while len(log) > 1 and log[1].t <= now - keep_s:
                log.popleft()


@dataclass(slots=True)
class RoleSignals:
    """One role's aggregate over a window. Rates are per second; latencies in seconds."""

    num_replicas: int = 0
    num_known: int = 0
    num_unknown: int = 0
    num_waiting: float = 0.0
    num_running: float = 0.0
    kv_usage_mean: float = 0.0
    kv_usage_max: float = 0.0
    num_waiting_prompt_tokens: float | None = None  # None: unknown (see backlog_from)
    ttft_p90_s: float | None = None
    # The p90 of each request's mean time per output token where the engines export it
    # (vllm:request_time_per_output_token_seconds, what the SLO and the router's TPOT mean),
    # else of the gaps between tokens (vllm:inter_token_latency_seconds): a short answer
    # stalled by one long prefill step misses the SLO though most of its gaps are short.
    itl_p90_s: float | None = None
    is_itl_per_request: bool = False  # which of the two itl_p90_s is
    # None: no replica exports vllm:request_queue_time_seconds (or none finished)
    queue_time_p90_s: float | None = None
    preemptions_per_s: float = 0.0
    request_rate: float = 0.0
    # How much faster than request_rate the others arrive around a typical request: the
    # request-weighted rate of the other first tokens in its scrape interval, less the
    # mean (`burst_rate`). About 0 for Poisson arrivals, and 0 with one interval.
    burst_rate: float = 0.0
    prompt_tokens_per_s: float = 0.0
    uncached_prompt_tokens_per_s: float = 0.0
    generation_tokens_per_s: float = 0.0
    num_held_requests: int = 0  # held by the router for this pool (scale from zero)
    backlog_from: str = ""  # BACKLOG_*: where num_waiting_prompt_tokens came from
    perf: RoleCoefficients | None = None  # the routers' perf-model fit for the role
    # Not scraped: the control loop fills these from the runtime's replicas (loop/observe.py).
    num_pending_overdue: int = 0  # in service, not ready for longer than pending_after_s
    pending_for_s: float = 0.0  # how long the oldest of those has not been ready
    pending_after_s: float = 0.0  # the start-up time after which a replica is overdue

    @property
    def is_idle(self) -> bool:
        """True only when every replica is known and none has work or traffic."""
        return (
            self.num_unknown == 0
            and self.num_held_requests == 0
            and self.num_waiting == 0
            and self.num_running == 0
            and self.request_rate == 0
        )

    def to_dict(self) -> dict[str, Any]:
        out = {k: getattr(self, k) for k in self.__slots__}  # type: ignore[attr-defined]
        perf = self.perf
        out["perf"] = None if perf is None else {
            "ttft": list(perf.ttft), "tpot": list(perf.tpot),
            "num_ttft_samples": perf.num_ttft_samples, "num_tpot_samples": perf.num_tpot_samples}
        return out


@dataclass(slots=True)
class Signals:
    """Per-role aggregates over one window ending at `t`."""

    t: float
    window_s: float
    roles: dict[str, RoleSignals]


# Where a role's queued prompt tokens came from (RoleSignals.backlog_from).
BACKLOG_EXPORTED = "kvfleet:num_waiting_prompt_tokens"
BACKLOG_DERIVED = (
    "derived: vllm:num_requests_waiting x mean prompt (vllm:prompt_tokens_total / requests)"
    " x (1 - vllm:prefix_cache_hits/queries)"
)
BACKLOG_UNKNOWN = "unknown: requests wait but no prompt length is known yet"


def _replica_backlog(
    gauges: list[ReplicaSample], first: ReplicaSample | None, last: ReplicaSample
) -> tuple[float | None, str]:
    """(queued uncached prompt tokens, source) for one replica over the window."""
    exported = [g.num_waiting_prompt_tokens for g in gauges]
    if all(v is not None for v in exported):
        return sum(v for v in exported if v is not None) / len(exported), BACKLOG_EXPORTED
    waiting = sum(g.num_waiting for g in gauges) / len(gauges)
    if waiting == 0:
        return 0.0, BACKLOG_DERIVED
    base = first if first is not None and last.num_requests > first.num_requests else None
    if base is not None and last.num_prompt_tokens >= base.num_prompt_tokens:
        prompt = last.num_prompt_tokens - base.num_prompt_tokens
        requests = last.num_requests - base.num_requests
        queries = last.num_prefix_queries - base.num_prefix_queries
        hits = last.num_prefix_hits - base.num_prefix_hits
    else:  # no request started in the window (or a restart): the process lifetime
        prompt, requests = last.num_prompt_tokens, last.num_requests
        queries, hits = last.num_prefix_queries, last.num_prefix_hits
    if requests <= 0 or prompt <= 0:
        return None, BACKLOG_UNKNOWN
    uncached = 1.0 - min(1.0, max(0.0, hits / queries)) if queries > 0 else 1.0
    return waiting * prompt / requests * uncached, BACKLOG_DERIVED


def _increase(first: float, last: float) -> float:
    """A counter's increase; a drop means the process restarted, so count from zero."""
    return last if last < first else last - first


def _rate(first: float, last: float, dt: float) -> float:
    """Counter rate (`_increase` per second)."""
    if dt <= 0:
        return 0.0
    return _increase(first, last) / dt


def _bucket_delta(first: Buckets, last: Buckets) -> dict[float, float]:
    before = dict(first)
    if last and before and last[-1][1] < before.get(last[-1][0], 0.0):
        before = {}  # counter reset
    return {le: max(0.0, n - before.get(le, 0.0)) for le, n in last}


def histogram_quantile(q: float, cumulative: Mapping[float, float]) -> float | None:
    """Prometheus-style quantile from cumulative buckets (le -> count); None when empty."""
    items = sorted(cumulative.items())
    if not items or items[-1][1] <= 0:
        return None
    rank = q * items[-1][1]
    lower_le, lower_n = 0.0, 0.0
    for le, n in items:
        if n >= rank:
            if math.isinf(le):
                return lower_le  # like Prometheus: the highest finite bound
            if n == lower_n:
                return le
            return lower_le + (le - lower_le) * (rank - lower_n) / (n - lower_n)
        lower_le, lower_n = le, n
    return lower_le


def _window(log: Iterable[Scrape], start: float, now: float) -> tuple[Scrape | None, list[Scrape]]:
    """(baseline: newest good scrape at or before start, good scrapes inside the window)."""
    baseline: Scrape | None = None
    inside: list[Scrape] = []
    for s in log:
        if s.sample is None or s.t > now:
            continue
        if s.t <= start:
            baseline = s
        else:
            inside.append(s)
    return baseline, inside


def _is_known(log: deque[Scrape], now: float, stale_after_s: float) -> bool:
    if not log:
        return False
    newest = log[-1]
    return newest.sample is not None and now - newest.t <= stale_after_s


def aggregate(
    log: ScrapeLog,
    roles: Mapping[str, str],
    now: float,
    window_s: float,
    stale_after_s: float,
    num_held_requests: int = 0,
    expected_roles: Iterable[str] = (),
    perf_models: Mapping[str, RoleCoefficients] | None = None,
) -> Signals:
    """Aggregate `log` per role. `roles` maps replica name -> role for the current fleet;
    `expected_roles` get an entry even with no replica (a role at zero still sees the
    router's held requests, its demand for scale from zero)."""
    out: dict[str, RoleSignals] = {role: RoleSignals() for role in expected_roles}
    hists: dict[str, dict[str, dict[float, float]]] = {}
    kv_means: dict[str, list[float]] = {}
    backlogs: dict[str, list[tuple[float | None, str]]] = {}
    intervals: dict[str, dict[float, list[float]]] = {}  # role -> end -> [requests, seconds]
    for replica, role in roles.items():
        rs = out.setdefault(role, RoleSignals())
        rs.num_replicas += 1
        scrapes = log.scrapes.get(replica, deque())
        if not _is_known(scrapes, now, stale_after_s):
            rs.num_unknown += 1
            continue
        rs.num_known += 1
        baseline, inside = _window(scrapes, now - window_s, now)
        newest = scrapes[-1].sample
        assert newest is not None  # _is_known checked it
        gauges = [s.sample for s in inside if s.sample is not None] or [newest]
        n = len(gauges)
        rs.num_waiting += sum(g.num_waiting for g in gauges) / n
        rs.num_running += sum(g.num_running for g in gauges) / n
        kv_means.setdefault(role, []).append(sum(g.kv_usage for g in gauges) / n)
        rs.kv_usage_max = max(rs.kv_usage_max, max(g.kv_usage for g in gauges))
        first = baseline or (inside[0] if inside else None)
        last = inside[-1] if inside else None
        backlogs.setdefault(role, []).append(_replica_backlog(
            gauges, first.sample if first is not None and first is not last else None, newest))
        if first is None or last is None or first is last:
            continue  # one point: no rate yet
        by_end = intervals.setdefault(role, {})
        for before, after in itertools.pairwise([first, *inside] if baseline else inside):
            assert before.sample is not None and after.sample is not None
            # replicas are scraped on the same tick, so one interval per end time
            counted = by_end.setdefault(after.t, [0.0, after.t - before.t])
            counted[0] += _increase(before.sample.num_requests, after.sample.num_requests)
        a, b = first.sample, last.sample
        assert a is not None and b is not None
        dt = last.t - first.t
        rs.preemptions_per_s += _rate(a.num_preemptions, b.num_preemptions, dt)
        rs.request_rate += _rate(a.num_requests, b.num_requests, dt)
        prompt = _rate(a.num_prompt_tokens, b.num_prompt_tokens, dt)
        hits = _rate(a.num_prefix_hits, b.num_prefix_hits, dt)
        rs.prompt_tokens_per_s += prompt
        rs.uncached_prompt_tokens_per_s += max(0.0, prompt - hits)
        rs.generation_tokens_per_s += _rate(a.num_generation_tokens, b.num_generation_tokens, dt)
        role_h = hists.setdefault(role, {key: {} for key in _HISTOGRAMS.values()})
        for key, merged in role_h.items():
            for le, d in _bucket_delta(getattr(a, key), getattr(b, key)).items():
                merged[le] = merged.get(le, 0.0) + d
    for role, rs in out.items():
        rs.burst_rate = burst_rate(list(intervals.get(role, {}).values()))
        means = kv_means.get(role, [])
        rs.kv_usage_mean = sum(means) / len(means) if means else 0.0
        rs.num_held_requests = num_held_requests
        rs.perf = (perf_models or {}).get(role)
        parts = backlogs.get(role, [])
        if parts:
            sources = {src for _, src in parts}
            known = [v for v, _ in parts if v is not None]
            rs.num_waiting_prompt_tokens = sum(known) if len(known) == len(parts) else None
            rs.backlog_from = (BACKLOG_UNKNOWN if rs.num_waiting_prompt_tokens is None
                               else " + ".join(sorted(sources)))
        if role in hists:
            rs.ttft_p90_s = histogram_quantile(0.9, hists[role]["ttft"])
            per_request = histogram_quantile(0.9, hists[role]["tpot"])
            rs.is_itl_per_request = per_request is not None
            rs.itl_p90_s = per_request if per_request is not None else histogram_quantile(
                0.9, hists[role]["itl"])
            rs.queue_time_p90_s = histogram_quantile(0.9, hists[role]["queue_time"])
    return Signals(t=now, window_s=window_s, roles=out)


def burst_rate(intervals: Sequence[Sequence[float]]) -> float:
    """From (requests, seconds) per scrape interval: the rate of the others around a typical
    request, sum(c (c - 1) / dt) / sum(c) (a request sees its interval's other c - 1 over
    dt), less the mean rate sum(c) / sum(dt); at least 0. Poisson arrivals give about 0
    (E[c (c - 1)] = (rate dt)^2); arrivals in clumps give the clumps' rate, which the mean
    over a window of quiet seconds hides."""
    total = sum(c for c, _ in intervals)
    span = sum(dt for _, dt in intervals)
    if total <= 0 or span <= 0:
        return 0.0
    seen = sum(c * (c - 1.0) / dt for c, dt in intervals if dt > 0) / total
    return max(0.0, seen - total / span)


PERF_COEFFICIENT = "kvfleet_router_perf_model_coefficient"
PERF_EVIDENCE = "kvfleet_router_perf_model_evidence"
PERF_PROMPT = "kvfleet_router_perf_model_prompt_ktokens"


def parse_router_perf_models(text: str) -> dict[str, RoleCoefficients]:
    """role -> the fit one router exports; a role missing a weight is left out, one missing
    a prompt statistic has no prompts (a router that predates them)."""
    parsed = c.parse_text(text, only=[PERF_COEFFICIENT, PERF_EVIDENCE, PERF_PROMPT])
    weights: dict[tuple[str, str], dict[str, float]] = {}
    evidence: dict[tuple[str, str], float] = {}
    prompts: dict[str, dict[str, float]] = {}
    for x in parsed.samples:
        role, target = x.labels.get("role", ""), x.labels.get("target", "")
        if not math.isfinite(x.value):
            continue
        if x.name == PERF_COEFFICIENT:
            weights.setdefault((role, target), {})[x.labels.get("feature", "")] = x.value
        elif x.name == PERF_PROMPT:
            prompts.setdefault(role, {})[x.labels.get("stat", "")] = x.value
        else:
            evidence[(role, target)] = x.value
    out: dict[str, RoleCoefficients] = {}
    for role in sorted({r for r, _ in weights}):
        ttft = weights.get((role, "ttft"), {})
        tpot = weights.get((role, "tpot"), {})
        if set(TTFT_FEATURES) - set(ttft) or set(TPOT_FEATURES) - set(tpot):
            continue
        stats = prompts.get(role, {})
        prompt = tuple(stats[n] for n in PROMPT_STATS) if set(PROMPT_STATS) <= set(stats) \
            else ()
        out[role] = RoleCoefficients(
            tuple(ttft[f] for f in TTFT_FEATURES), tuple(tpot[f] for f in TPOT_FEATURES),
            int(evidence.get((role, "ttft"), 0)), int(evidence.get((role, "tpot"), 0)),
            prompt)
    return out


def combine_perf_models(parts: Iterable[Mapping[str, RoleCoefficients]]
                        ) -> dict[str, RoleCoefficients]:
    """Several routers' fits as one per role: each weight the evidence-weighted mean (a
    router with no evidence counts once), the evidence summed; the prompt statistics the
    same over the routers that export them (a mean of quantiles, close enough for
    routers that see the same traffic)."""
    by_role: dict[str, list[RoleCoefficients]] = {}
    for part in parts:
        for role, fit in part.items():
            by_role.setdefault(role, []).append(fit)
    out = {}
    for role, fits in sorted(by_role.items()):
        if len(fits) == 1:
            out[role] = fits[0]
            continue

        def mean(vectors: list[tuple[float, ...]], ns: list[int]) -> tuple[float, ...]:
            ws = [max(1, n) for n in ns]
            return tuple(sum(w * v[i] for w, v in zip(ws, vectors, strict=True)) / sum(ws)
                         for i in range(len(vectors[0])))

        nt, np_ = [f.num_ttft_samples for f in fits], [f.num_tpot_samples for f in fits]
        with_prompts = [(f.prompt, f.num_ttft_samples) for f in fits if f.prompt]
        prompt = mean([p for p, _ in with_prompts], [n for _, n in with_prompts]) \
            if with_prompts else ()
        out[role] = RoleCoefficients(mean([f.ttft for f in fits], nt),
                                     mean([f.tpot for f in fits], np_), sum(nt), sum(np_),
                                     prompt)
    return out
