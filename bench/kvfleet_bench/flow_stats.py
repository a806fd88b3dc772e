"""Figures of bench/flow_control.py (live) and bench/flow_control_sim.py (the simulator)
from the outcomes of one run, and their medians over repetitions, pure.

A measured window [start, end) (seconds after the run's t0) leaves the warm-up out:
latencies are those of requests that *started* in it; served tokens and throughput those of
requests that *ended* in it (what the pool delivered then, whenever it was asked). Outcome
counts cover every request of the run, warm-up included, so none goes uncounted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from kvfleet_bench.flow_client import Outcome
from kvfleet_bench.stats import percentile, spread

# Issue 28's scenarios and targets, the same for the live bench and the simulator's
FAIR_WEIGHTS = {"w1a": 1.0, "w1b": 1.0, "w2": 2.0, "w4": 4.0}
TARGETS = {"isolation_ttft_p90_ratio": 1.25, "fair_max_rel_error": 0.10,
           "fair_jain_equal_weight": 0.95, "priority_ttft_p99_ratio": 1.25,
           "quota_rel_error": 0.05}


def jain(values: Iterable[float]) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 when all are equal, 1/n at worst."""
    xs = list(values)
    if not xs:
        raise ValueError("jain: no values")
    squares = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * squares) if squares else 1.0


def outcome_counts(outcomes: Iterable[Outcome]) -> dict[str, int]:
    """ok, each refusal as "<status> <reason>", and every other failure by kind."""
    counts: Counter[str] = Counter()
    for o in outcomes:
        if o.is_ok:
            counts["ok"] += 1
        elif o.is_refused:
            counts[f"{o.status} {o.reason}"] += 1
        else:
            counts[f"lost: {o.status or 'no answer'} {o.reason}".strip()] += 1
    return dict(sorted(counts.items()))


def tenant_summary(outcomes: list[Outcome], tenant: str, start_s: float,
                   end_s: float) -> dict[str, Any]:
    mine = [o for o in outcomes if o.tenant == tenant]
    started = [o for o in mine if o.is_ok and start_s <= o.start_s < end_s]
    ended = [o for o in mine if o.is_ok and start_s <= o.end_s < end_s]
    ttfts = [o.ttft_s for o in started]
    window = end_s - start_s
    return {
        "num_requests": len(mine),
        "num_ok": sum(o.is_ok for o in mine),
        "num_refused": sum(o.is_refused for o in mine),
        "num_unexplained": sum(o.is_unexplained for o in mine),
        "outcomes": outcome_counts(mine),
        "num_ttft_samples": len(ttfts),
        "ttft_p50_ms": 1000 * percentile(ttfts, 50),
        "ttft_p90_ms": 1000 * percentile(ttfts, 90),
        "ttft_p99_ms": 1000 * percentile(ttfts, 99),
        # first token to the end: how long a request keeps its engine slot after its prefill
        "decode_p50_ms": 1000 * percentile([o.end_s - o.start_s - o.ttft_s for o in started],
                                           50),
        "served_rps": len(ended) / window,
        "served_tokens": sum(o.num_tokens for o in ended),
        "served_tokens_per_s": sum(o.num_tokens for o in ended) / window,
    }


def summarise(outcomes: list[Outcome], start_s: float, end_s: float) -> dict[str, Any]:
    """Per tenant (see tenant_summary), and the run's totals."""
    tenants = sorted({o.tenant for o in outcomes})
    per = {t: tenant_summary(outcomes, t, start_s, end_s) for t in tenants}
    return {
        "tenants": per,
        "num_requests": len(outcomes),
        "num_unexplained": sum(o.is_unexplained for o in outcomes),
        "outcomes": outcome_counts(outcomes),
        "served_tokens_per_s": sum(s["served_tokens_per_s"] for s in per.values()),
        "served_rps": sum(s["served_rps"] for s in per.values()),
    }


def weighted_shares(served: Mapping[str, float], weights: Mapping[str, float]) -> dict[str, Any]:
    """Each tenant's share of the served tokens against its weight's share: the relative
    error |share / weight share - 1|, and Jain's index over share / weight (1 = exactly
    weighted) and among the tenants of equal weight (per weight)."""
    total = sum(served.get(t, 0.0) for t in weights)
    total_w = sum(weights.values())
    if total <= 0 or total_w <= 0:
        raise ValueError("weighted_shares: nothing served")
    out: dict[str, Any] = {"tenants": {}}
    for t, w in weights.items():
        share, fair = served.get(t, 0.0) / total, w / total_w
        out["tenants"][t] = {"weight": w, "share": share, "weight_share": fair,
                             "rel_error": abs(share / fair - 1)}
    out["max_rel_error"] = max(v["rel_error"] for v in out["tenants"].values())
    out["jain_weighted"] = jain(served.get(t, 0.0) / w for t, w in weights.items())
    by_weight: dict[float, list[float]] = {}
    for t, w in weights.items():
        by_weight.setdefault(w, []).append(served.get(t, 0.0))
    out["jain_equal_weight"] = {f"{w:g}": jain(xs) for w, xs in by_weight.items() if len(xs) > 1}
    return out


def quota_check(outcomes: list[Outcome], tenant: str, start_s: float, end_s: float,
                rpm: float = 0.0, tpm: float = 0.0) -> dict[str, Any]:
    """What a rate-limited tenant was served over [start, end) (requests by start time,
    tokens by their usage) against its per-minute limit scaled to the window."""
    mine = [o for o in outcomes if o.tenant == tenant and start_s <= o.start_s < end_s]
    ok = [o for o in mine if o.is_ok]
    minutes = (end_s - start_s) / 60.0
    out: dict[str, Any] = {"window_s": end_s - start_s, "num_sent": len(mine),
                           "num_ok": len(ok), "num_429": sum(o.status == 429 for o in mine),
                           "outcomes": outcome_counts(mine)}
    if rpm:
        out["limit_rpm"] = rpm
        out["served_over_limit"] = len(ok) / (rpm * minutes)
    if tpm:
        out["limit_tpm"] = tpm
        out["served_tokens"] = sum(o.num_tokens for o in ok)
        out["served_over_limit"] = out["served_tokens"] / (tpm * minutes)
    return out


def is_openai_rate_limit(o: Outcome, kind: str) -> dict[str, bool]:
    """Does a quota refusal look like OpenAI's: 429, error code rate_limit_exceeded with
    type `kind` (requests | tokens) and a message, Retry-After, and the x-ratelimit-*
    headers of that limit."""
    err = o.error or {}
    suffix = "requests" if kind == "requests" else "tokens"
    return {
        "status_429": o.status == 429,
        "code_rate_limit_exceeded": err.get("code") == "rate_limit_exceeded",
        "type_matches": err.get("type") == kind,
        "has_message": bool(err.get("message")),
        "has_retry_after": "retry-after" in o.headers,
        "has_x_ratelimit_headers": all(f"x-ratelimit-{h}-{suffix}" in o.headers
                                       for h in ("limit", "remaining", "reset")),
    }


# --- medians (min-max) over repetitions: one scenario's rows -> its figures ---

def isolation_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """A's TTFT p90 alone and beside B's flood, their ratio, A's losses, served rates."""
    ratio = spread(r["ttft_p90_ratio"] for r in rows)
    lost = sum(r["a_lost"] for r in rows)
    return {
        "a_ttft_p90_alone_ms": spread(r["alone"]["tenants"]["A"]["ttft_p90_ms"] for r in rows),
        "a_ttft_p90_flood_ms": spread(r["flood"]["tenants"]["A"]["ttft_p90_ms"] for r in rows),
        "a_ttft_p90_ratio": ratio, "a_lost": lost,
        "a_served_rps": spread(r["flood"]["tenants"]["A"]["served_rps"] for r in rows),
        "b_served_rps": spread(r["flood"]["tenants"]["B"]["served_rps"] for r in rows),
        "is_ratio_met": ratio["median"] <= TARGETS["isolation_ttft_p90_ratio"],
        "is_nothing_lost_for_a": lost == 0,
    }


def fair_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Each weighted tenant's share of the served tokens, the largest gap, Jain's index."""
    f: dict[str, Any] = {
        "share": {t: spread(r["shares"]["tenants"][t]["share"] for r in rows)
                  for t in FAIR_WEIGHTS},
        "weight": dict(FAIR_WEIGHTS),
        "weight_share": {t: w / sum(FAIR_WEIGHTS.values()) for t, w in FAIR_WEIGHTS.items()},
        "max_rel_error": spread(r["shares"]["max_rel_error"] for r in rows),
        "jain_equal_weight": spread(r["shares"]["jain_equal_weight"]["1"] for r in rows),
        "capacity_tokens_per_s": spread(r["capacity_tokens_per_s"] for r in rows),
    }
    f["is_share_met"] = f["max_rel_error"]["median"] <= TARGETS["fair_max_rel_error"]
    f["is_jain_met"] = f["jain_equal_weight"]["median"] >= TARGETS["fair_jain_equal_weight"]
    return f


def priority_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Critical's TTFT p99 alone and beside a sheddable flood, its ratio and losses, and
    what the sheddable tenant was served of the capacity critical left."""
    ratio = spread(r["ttft_p99_ratio"] for r in rows)
    return {
        "crit_ttft_p99_alone_ms": spread(r["alone"]["tenants"]["crit"]["ttft_p99_ms"]
                                         for r in rows),
        "crit_ttft_p99_flood_ms": spread(r["flood"]["tenants"]["crit"]["ttft_p99_ms"]
                                         for r in rows),
        "crit_ttft_p99_ratio": ratio,
        "crit_samples": spread(r["flood"]["tenants"]["crit"]["num_ttft_samples"] for r in rows),
        "crit_lost": sum(r["crit_lost"] for r in rows),
        "shed_served_tokens_per_s": spread(
            r["flood"]["tenants"]["shed"]["served_tokens_per_s"] for r in rows),
        "shed_of_capacity_left": spread(r.get("shed_of_capacity_left", float("nan"))
                                        for r in rows),
        "is_ratio_met": ratio["median"] <= TARGETS["priority_ttft_p99_ratio"],
    }
