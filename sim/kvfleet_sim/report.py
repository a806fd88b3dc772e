"""Summaries of a simulation run: latency percentiles, SLO attainment, replica-seconds,
prefix-cache hit rate and load imbalance; with `routing.kvSharing`, the prefix tokens
reused split into local hits and tokens fetched from peers, and the bytes moved; the
requests flow control refused, by reason; with more than one tenant in the trace, per
tenant: requests, served, refused, failed, TTFT percentiles and served tokens."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kvfleet_engine.server.metrics import mean_time_per_output_token

from kvfleet_sim.fleet import SimResult
from kvfleet_sim.peer_fetch import PeerStats
from kvfleet_sim.replica import Finished
from kvfleet_sim.trace import DEFAULT_TENANT


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return _ranked(ordered, q)


def _ranked(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        return math.nan
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


@dataclass(slots=True)
class Summary:
    name: str
    num_requests: int
    num_failed: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    itl_p50_s: float
    itl_p90_s: float
    itl_p99_s: float
    e2e_p50_s: float
    e2e_p90_s: float
    e2e_p99_s: float
    # fraction of measured requests with TTFT <= slo and mean ITL <= slo; a failed request
    # is in the denominator as a miss (failing requests must never raise attainment)
    slo_attainment: float
    prefix_hit_rate: float  # prompt tokens found in the engines' prefix caches / looked up
    router_hit_estimate: float  # the router's own estimate of the same (prefix index)
    imbalance_mean: float  # load imbalance over time: (max - min) / mean of queue/capacity
    imbalance_p90: float
    replica_seconds: float
    replica_seconds_by_role: dict[str, float]
    mean_replicas: float
    max_replicas: int
    num_scale_events: int
    duration_s: float
    peer: dict[str, Any] | None = None  # routing.kvSharing only (`peer_summary`)
    # the busiest replica's measured requests / the fair share (total / max replicas)
    max_share: float = 0.0
    # the router's perf model (perf_model.py): mean absolute percentage error of the TTFT
    # and TPOT predicted for measured streams (None: nothing was predicted)
    ttft_mape: float | None = None
    tpot_mape: float | None = None
    # replica_seconds / the hindsight optimum's for the same slice, pool and start-up
    # (oracle.py); set by run.run_variants when the oracle was solved, else None
    x_optimum: float | None = None
    # measured requests the router refused (429/503: queue TTL, queue full), by reason;
    # they are among num_failed. None when none was.
    refusals: dict[str, int] | None = None
    # tenant -> `tenant_summary` of its measured requests; None with one tenant
    tenants: dict[str, dict[str, Any]] | None = None
    # `median_summary`: the runs (router seeds) this row is the median of, and the
    # [min, max] over them of the columns a routing verdict reads (SPREAD_FIELDS)
    num_seeds: int = 1
    spread: dict[str, list[float]] | None = None

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for key in ("peer", "x_optimum", "refusals", "tenants", "spread"):
            if out[key] is None:
                del out[key]  # as before these were simulated
        if self.num_seeds == 1:
            del out["num_seeds"]
        return out


# replica-seconds: under an autoscaler the router's seed moves scale decisions too (which
# replica a burst lands on, so when a window's latency crosses its target)
SPREAD_FIELDS = ("slo_attainment", "prefix_hit_rate", "imbalance_mean", "max_share",
                 "replica_seconds")


def median_summary(summaries: Sequence[Summary]) -> Summary:
    """One row for runs that differ only in the router's seed (ties broken at random, the
    weighted pickers' draws): each numeric column's own median, so a row's columns may come
    from different seeds; names and breakdowns (per role, peer, tenants) from the first
    run; `spread` the [min, max] of SPREAD_FIELDS. One seed's differences between policies
    are often within this spread (bench/sim_policies.md, the tuning table's match0 row:
    most of a point over five seeds)."""
    first = summaries[0]
    if len(summaries) == 1:
        return first
    row = asdict(first)
    for key, value in row.items():
        if key == "num_seeds" or not isinstance(value, (int, float, type(None))):
            continue
        column = [getattr(s, key) for s in summaries]
        if any(v is None for v in column):  # unknown in one run: unknown (a MAPE, x optimum)
            row[key] = None
        else:
            row[key] = (statistics.median_low if isinstance(value, int)
                        else statistics.median)(column)
    row["num_seeds"] = len(summaries)
    row["spread"] = {k: [min(getattr(s, k) for s in summaries),
                         max(getattr(s, k) for s in summaries)] for k in SPREAD_FIELDS}
    return Summary(**row)


def peer_summary(stats: PeerStats, prefix_tokens: tuple[int, int]) -> dict[str, Any]:
    """Prefix tokens reused, local (the engine's own cache) and fetched (installed from a
    peer, then hit), the bytes moved, hints by reason and fetches by outcome. The engines
    count a fetched block's tokens as prefix hits once the request is admitted, so local
    hits are the engines' hits less the fetched tokens."""
    queried, hit = prefix_tokens
    n = sum(stats.outcomes.values())
    return {
        "prefix_tokens_queried": queried,
        "prefix_tokens_local": max(0, hit - stats.num_tokens),
        "prefix_tokens_fetched": stats.num_tokens,
        "fetched_blocks": stats.num_blocks,
        "bytes_moved": stats.num_bytes,
        "fetch_mean_s": stats.fetch_seconds / n if n else 0.0,
        "hints": dict(sorted(stats.hints.items())),
        "hints_by_decision": dict(sorted(stats.by_decision.items())),
        "fetches": dict(sorted(stats.outcomes.items())),
    }


def tenant_summary(finished: Sequence[Finished]) -> dict[str, Any]:
    """One tenant's measured requests: how many, served, refused by the router, failed
    otherwise, TTFT p50/p90/p99 of the served ones, and the tokens served (prompt plus
    output of the served ones)."""
    done = [f for f in finished if not f.is_aborted]
    ttfts = sorted(f.first_token - f.arrival for f in done)
    refused = sum(bool(f.refusal) for f in finished)
    return {
        "num_requests": len(finished),
        "num_served": len(done),
        "num_refused": refused,
        "num_failed": len(finished) - len(done) - refused,
        "ttft_p50_s": _ranked(ttfts, 50),
        "ttft_p90_s": _ranked(ttfts, 90),
        "ttft_p99_s": _ranked(ttfts, 99),
        "served_tokens": sum(f.num_prompt_tokens + f.num_output_tokens for f in done),
    }


def tenant_summaries(finished: Sequence[Finished], tenants: dict[str, str]
                     ) -> dict[str, dict[str, Any]] | None:
    """tenant -> `tenant_summary`, by name; None when all of `finished` is one tenant's.
    `tenants`: request id -> tenant (SimResult.tenants: the default tenant is omitted)."""
    groups: dict[str, list[Finished]] = {}
    for f in finished:
        groups.setdefault(tenants.get(f.request_id, DEFAULT_TENANT), []).append(f)
    if len(groups) < 2:
        return None
    return {name: tenant_summary(groups[name]) for name in sorted(groups)}


MET, TTFT_MISSED, ITL_MISSED, FAILED = "met", "ttft", "itl", "failed"


def slo_outcome(f: Finished, ttft_slo_s: float, itl_slo_s: float) -> str:
    """How one request fared against the SLO: failed (aborted), TTFT missed, ITL missed
    (first token in time, mean inter-token time above the target), or met."""
    if f.is_aborted:
        return FAILED
    if f.first_token - f.arrival > ttft_slo_s:
        return TTFT_MISSED
    tpot = mean_time_per_output_token(f.first_token, f.finished, f.num_output_tokens)
    return ITL_MISSED if tpot > itl_slo_s else MET


@dataclass(frozen=True, slots=True)
class MissWindow:
    """The requests that arrived in one window of a run, by how they fared, and the
    replicas ready then (the most any decision in the window saw; the last one before it
    where none fell inside)."""

    start_s: float  # from the measured window's start
    num_arrivals: int
    num_ttft_missed: int
    num_itl_missed: int
    num_failed: int
    max_ready: int

    @property
    def num_missed(self) -> int:
        return self.num_ttft_missed + self.num_itl_missed + self.num_failed

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def miss_windows(result: SimResult, ttft_slo_s: float, itl_slo_s: float, start_s: float,
                 end_s: float, every_s: float) -> list[MissWindow]:
    """[start_s, end_s) cut into windows of `every_s` (the last may be shorter): where in a
    run its SLO misses fell, beside the replicas it had ready then."""
    if not every_s > 0:
        raise ValueError(f"the window must be > 0 s, got {every_s}")
    num = max(1, math.ceil((end_s - start_s) / every_s - 1e-9))
    counts = [[0, 0, 0, 0] for _ in range(num)]
    slot = {TTFT_MISSED: 1, ITL_MISSED: 2, FAILED: 3}
    for f in result.finished:
        if start_s <= f.arrival < end_s:
            c = counts[min(num - 1, int((f.arrival - start_s) // every_s))]
            c[0] += 1
            if (outcome := slo_outcome(f, ttft_slo_s, itl_slo_s)) != MET:
                c[slot[outcome]] += 1
    most: list[int | None] = [None] * num  # the most ready at a decision in each window
    last: list[int | None] = [None] * num  # and at its last decision
    before = 0  # ready at the last decision before the measured window
    for t, _, num_ready in result.timeline:  # in time order
        if t < start_s:
            before = num_ready
        elif t < end_s:
            k = min(num - 1, int((t - start_s) // every_s))
            most[k] = max(most[k] or 0, num_ready)
            last[k] = num_ready
    out = []
    for k, (n, ttft, itl, failed) in enumerate(counts):
        most_k, last_k = most[k], last[k]
        out.append(MissWindow(k * every_s, n, ttft, itl, failed,
                              before if most_k is None else most_k))
        before = before if last_k is None else last_k
    return out


def replica_seconds(lifetimes: Sequence[tuple[float, float]], start: float, end: float) -> float:
    """Replica-seconds inside [start, end]; a replica counts from provisioning to stop."""
    return sum(max(0.0, min(b, end) - max(a, start)) for a, b in lifetimes)


def summarize(
    name: str,
    result: SimResult,
    ttft_slo_s: float,
    itl_slo_s: float,
    start_s: float = 0.0,
    end_s: float | None = None,
) -> Summary:
    """Requests that arrived in [start_s, end_s) (after warm-up) and replica time over that
    same span (default: to the last request's end), so every scaler pays for one window."""
    end_s = result.end_s if end_s is None else end_s
    measured = [f for f in result.finished if start_s <= f.arrival < end_s]
    done = [f for f in measured if not f.is_aborted]
    ttfts = sorted(f.first_token - f.arrival for f in done)
    e2es = sorted(f.finished - f.arrival for f in done)
    itls = sorted(result.itl_gaps)
    met = sum(1 for f in done if slo_outcome(f, ttft_slo_s, itl_slo_s) == MET)
    n = len(measured)
    seconds = replica_seconds(result.lifetimes, start_s, end_s)
    by_role: dict[str, float] = {}
    for life, role in zip(result.lifetimes, result.lifetime_roles, strict=True):
        by_role[role] = by_role.get(role, 0.0) + replica_seconds([life], start_s, end_s)
    span = end_s - start_s
    queried, hit = result.prefix_tokens
    imbalance = sorted(v for t, v in result.imbalance if start_s <= t < end_s)
    per_replica: dict[str, int] = {}
    for f in measured:
        per_replica[f.replica] = per_replica.get(f.replica, 0) + 1
    max_replicas = max((p for t, p, _ in result.timeline if start_s <= t < end_s), default=0)
    fair = n / max(max_replicas, len(per_replica), 1)
    (ttft_abs, ttft_n), (tpot_abs, tpot_n) = result.perf_error
    return Summary(
        name=name,
        num_requests=n,
        num_failed=n - len(done),
        ttft_p50_s=_ranked(ttfts, 50),
        ttft_p90_s=_ranked(ttfts, 90),
        ttft_p99_s=_ranked(ttfts, 99),
        itl_p50_s=_ranked(itls, 50),
        itl_p90_s=_ranked(itls, 90),
        itl_p99_s=_ranked(itls, 99),
        e2e_p50_s=_ranked(e2es, 50),
        e2e_p90_s=_ranked(e2es, 90),
        e2e_p99_s=_ranked(e2es, 99),
        slo_attainment=met / n if n else math.nan,
        prefix_hit_rate=hit / queried if queried else 0.0,
        router_hit_estimate=result.router_hit_ratio,
        imbalance_mean=sum(imbalance) / len(imbalance) if imbalance else 0.0,
        imbalance_p90=_ranked(imbalance, 90) if imbalance else 0.0,
        replica_seconds=seconds,
        replica_seconds_by_role=dict(sorted(by_role.items())),
        mean_replicas=seconds / span if span > 0 else math.nan,
        max_replicas=max_replicas,
        num_scale_events=sum(1 for t, _ in result.reasons if start_s <= t < end_s),
        duration_s=span,
        peer=peer_summary(result.peer, result.prefix_tokens) if result.peer is not None \
        else None,  # fmt: skip
        max_share=max(per_replica.values(), default=0) / fair if fair else 0.0,
        ttft_mape=ttft_abs / ttft_n if ttft_n else None,
        tpot_mape=tpot_abs / tpot_n if tpot_n else None,
        refusals=_refusals(measured),
        tenants=tenant_summaries(measured, result.tenants) if result.tenants else None,
    )


def _refusals(measured: Sequence[Finished]) -> dict[str, int] | None:
    """The measured requests the router refused, by reason; None when none was."""
    out: dict[str, int] = {}
    for f in measured:
        if f.refusal:
            out[f.refusal] = out.get(f.refusal, 0) + 1
    return dict(sorted(out.items())) or None
