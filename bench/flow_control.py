"""Flow control, measured live (issue 28's acceptance): isolation, fair shares, priorities,
quotas and the waiting room, with real processes on 127.0.0.1.

The pool: `--num-engines` kvfleet engines with the simulated runner on a made-up slow cost
profile (every step `--step-ms`, plus `--prefill-us-per-token` per prompt token computed),
`--max-num-seqs` each, so it saturates at a few requests per second; one kvfleet router in
front, each endpoint's in-flight cap (`capacity`) at `--max-num-seqs` so that requests
beyond the engines' batch wait in the router's flow-control queue, where tenants, bands and
weights decide who goes next. Every request is a streamed completion of `--prompt-chars`
characters and `--max-tokens` tokens tagged `x-kvfleet-tenant`; TTFT is its first body
chunk. A fresh router per run (no attained service or bucket carried over); the engines stay.

1. isolation: tenant A alone at `--rate` req/s, then A with tenant B at `--flood-factor`
   times that (equal weight, one band): A's TTFT p90 flood / alone (target <= 1.25x), A
   loses nothing.
2. fair shares: four closed-loop backlogged tenants of weights 1, 1, 2, 4: each one's share
   of the served tokens against its weight's (target within 10%), Jain's index between the
   two of weight 1 (target >= 0.95).
3. priorities: a critical tenant at `--rate`, alone then beside a sheddable flood: its TTFT
   p99 ratio (target <= 1.25x); the sheddable tenant's served tokens against what the pool
   served in (2) less what the critical one took.
4. quotas: one tenant over its RPM, one over its TPM (each sending twice its limit) for
   `--quota-window-s` from a cold start: served / limit (target within 5%), the 429s' shape
   (OpenAI's error and x-ratelimit-* headers), and the openai client raising RateLimitError.
5. waiting room: `kvfleet up` on a one-replica simulated pool; a completion sent the moment
   the router port opens (before any replica is ready) must succeed; its latency.

Each run has `--warmup-s` unmeasured, then `--measure-s` measured (latency by start time,
throughput by end time); every request is counted as ok, refused (429/503 with a reason), or
lost (anything else). Repetitions alternate the order of the two configurations compared.

    flock /tmp/kvfleet-cpu.lock .venv/bin/python bench/flow_control.py     # ~22 min
    flock /tmp/kvfleet-cpu.lock .venv/bin/python bench/flow_control.py --scenarios \
        isolation,priority --capacity 8 --out bench/results/flow_control_cap2x.json  # ~14 min:
        # the operator's cap (twice the batch), the README's second table
    .venv/bin/python bench/flow_control.py --quick     # isolation only, ~30 s (smoke test)
    .venv/bin/python bench/flow_control.py --quick --fairness off   # the same, unfair
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from kvfleet_bench import flow_fleet, flow_stats, loadgen, procs
from kvfleet_bench.cache_replay import git_state, pin_client
from kvfleet_bench.flow_client import TENANT_HEADER, TenantLoad, run_loads
from kvfleet_bench.flow_fleet import MODEL, EngineShape
from kvfleet_bench.flow_stats import FAIR_WEIGHTS, TARGETS
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.stats import spread

SCENARIOS = ("isolation", "fair", "priority", "quota", "waiting")



def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--warmup-s", type=float, default=5.0)
    p.add_argument("--measure-s", type=float, default=60.0)  # p99 of >= 90 TTFTs
    p.add_argument("--quota-window-s", type=float, default=60.0)
    p.add_argument("--num-engines", type=int, default=1)
    p.add_argument("--max-num-seqs", type=int, default=4)
    p.add_argument("--step-ms", type=float, default=20.0)
    p.add_argument("--prefill-us-per-token", type=float, default=50.0)
    p.add_argument("--prompt-chars", type=int, default=256)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--rate", type=float, default=1.5, help="tenant A's (and critical's) req/s")
    p.add_argument("--flood-factor", type=float, default=10.0)
    p.add_argument("--quota-rpm", type=int, default=90)
    p.add_argument("--quota-tpm", type=int, default=24000)
    p.add_argument("--capacity", type=int, default=0,
                   help="router in-flight cap per endpoint (default: --max-num-seqs)")
    p.add_argument("--fairness", choices=("on", "off"), default="on",
                   help="off: the router reads the tenant from a header no client sends, so "
                        "every request is one tenant's (FCFS): the broken case")
    p.add_argument("--out", default=str(procs.RESULTS_DIR / "flow_control.json"))
    p.add_argument("--quick", action="store_true", help="isolation only, one short rep")
    p.add_argument("--router-cpu", default="0")
    p.add_argument("--client-cpu", default="1")
    p.add_argument("--no-pin", action="store_true")
    args = p.parse_args(argv)
    if args.quick:
        args.scenarios, args.reps, args.warmup_s, args.measure_s = "isolation", 1, 2.0, 10.0
    args.scenario_list = [s for s in args.scenarios.split(",") if s]
    if bad := [s for s in args.scenario_list if s not in SCENARIOS]:
        p.error(f"unknown scenario(s) {', '.join(bad)}; choose from {', '.join(SCENARIOS)}")
    if min(args.reps, args.num_engines, args.max_num_seqs, args.max_tokens) < 1:
        p.error("--reps, --num-engines, --max-num-seqs and --max-tokens must be >= 1")
    if min(args.measure_s, args.rate, args.flood_factor, args.quota_window_s,
           args.quota_rpm, args.quota_tpm) <= 0 or args.warmup_s < 0:
        p.error("durations, rates and limits must be positive")
    args.capacity = args.capacity or args.max_num_seqs
    return args


def router_sections(args: argparse.Namespace, tenants: dict[str, dict] | None = None,
                    queue_timeout_s: float = 5.0, quotas: dict | None = None) -> dict:
    flow: dict[str, Any] = {"tenants": tenants or {}}
    if args.fairness == "off":
        flow["tenant_header"] = "x-bench-nobody-sends-this"
    sections: dict[str, dict] = {"flow_control": flow,
                                 "queue": {"timeout_s": queue_timeout_s, "max_size": 256}}
    if quotas:
        sections["quotas"] = quotas
    return sections


def run(args, urls, workdir, loads: list[TenantLoad], sections: dict, seed: int,
        duration_s: float | None = None, after=None) -> tuple[list, Any]:
    router = flow_fleet.start_router(urls, workdir, args.router_cpu_pin, args.capacity,
                                     sections)
    try:
        url = router.urls[0] + "/v1/completions"
        duration = args.warmup_s + args.measure_s if duration_s is None else duration_s
        outcomes = asyncio.run(run_loads(url, MODEL, loads, duration, seed))
        extra = after(router.urls[0]) if after else None
    finally:
        router.stop()
        flow_fleet.reset_engines(urls)
    return outcomes, extra


def window(args) -> tuple[float, float]:
    return args.warmup_s, args.warmup_s + args.measure_s


def load(args, tenant: str, **kw) -> TenantLoad:
    return TenantLoad(tenant, max_tokens=args.max_tokens, prompt_chars=args.prompt_chars, **kw)


def alternating(rep: int, pair: tuple[str, str]) -> tuple[str, str]:
    return pair if rep % 2 == 0 else pair[::-1]


def isolation(args, urls, workdir, rep: int) -> dict[str, Any]:
    out = {}
    for config in alternating(rep, ("alone", "flood")):
        loads = [load(args, "A", rate=args.rate)]
        if config == "flood":
            loads.append(load(args, "B", rate=args.rate * args.flood_factor))
        outcomes, _ = run(args, urls, workdir, loads, router_sections(args), seed=rep)
        out[config] = flow_stats.summarise(outcomes, *window(args))
    a_alone, a_flood = out["alone"]["tenants"]["A"], out["flood"]["tenants"]["A"]
    out["ttft_p90_ratio"] = a_flood["ttft_p90_ms"] / a_alone["ttft_p90_ms"]
    out["a_lost"] = a_flood["num_requests"] - a_flood["num_ok"]
    return out


def fair(args, urls, workdir, rep: int) -> dict[str, Any]:
    per_tenant = args.max_num_seqs * args.num_engines + 2  # always one queued, at least
    tenants = {t: {"weight": w} for t, w in FAIR_WEIGHTS.items()}
    loads = [load(args, t, concurrency=per_tenant) for t in FAIR_WEIGHTS]
    outcomes, _ = run(args, urls, workdir, loads, router_sections(args, tenants, 30.0), rep)
    summary = flow_stats.summarise(outcomes, *window(args))
    served = {t: s["served_tokens"] for t, s in summary["tenants"].items()}
    return {"run": summary, "shares": flow_stats.weighted_shares(served, FAIR_WEIGHTS),
            "capacity_tokens_per_s": summary["served_tokens_per_s"]}


def priority(args, urls, workdir, rep: int, capacity_tps: float | None) -> dict[str, Any]:
    tenants = {"crit": {"band": "critical"}, "shed": {"band": "sheddable"}}
    out: dict[str, Any] = {}
    for config in alternating(rep, ("alone", "flood")):
        loads = [load(args, "crit", rate=args.rate)]
        if config == "flood":
            loads.append(load(args, "shed", rate=args.rate * args.flood_factor))
        outcomes, _ = run(args, urls, workdir, loads, router_sections(args, tenants), rep)
        out[config] = flow_stats.summarise(outcomes, *window(args))
    crit_alone, crit_flood = out["alone"]["tenants"]["crit"], out["flood"]["tenants"]["crit"]
    out["ttft_p99_ratio"] = crit_flood["ttft_p99_ms"] / crit_alone["ttft_p99_ms"]
    out["crit_lost"] = crit_flood["num_requests"] - crit_flood["num_ok"]
    shed = out["flood"]["tenants"]["shed"]["served_tokens_per_s"]
    if capacity_tps:
        left = capacity_tps - crit_flood["served_tokens_per_s"]
        out["shed_of_capacity_left"] = shed / left if left > 0 else float("nan")
    return out


def _openai_client_check(base_url: str, tenant: str, attempts: int = 12) -> dict[str, Any]:
    """Burst requests through the official openai client until it raises RateLimitError."""
    import openai

    client = openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0,
                           default_headers={TENANT_HEADER: tenant}, timeout=30)
    for i in range(attempts):
        try:
            client.completions.create(model=MODEL, prompt="hi", max_tokens=1)
        except openai.RateLimitError as exc:
            return {"raises_rate_limit_error": True, "after_requests": i,
                    "message": str(exc)[:200]}
        except openai.OpenAIError as exc:
            return {"raises_rate_limit_error": False, "other_error": repr(exc)[:200]}
    return {"raises_rate_limit_error": False, "after_requests": attempts}


def quota(args, urls, workdir, rep: int) -> dict[str, Any]:
    per_request = args.prompt_chars + args.max_tokens  # the byte tokenizer: a char a token
    quotas = {"tenants": {"rpm-tenant": {"rpm": args.quota_rpm},
                          "tpm-tenant": {"tpm": args.quota_tpm}}}
    loads = [load(args, "rpm-tenant", rate=2 * args.quota_rpm / 60),
             load(args, "tpm-tenant", rate=2 * args.quota_tpm / 60 / per_request)]
    outcomes, client = run(args, urls, workdir, loads,
                           router_sections(args, quotas=quotas), rep, args.quota_window_s,
                           after=lambda base: _openai_client_check(base, "rpm-tenant"))
    w = args.quota_window_s
    out = {"rpm": flow_stats.quota_check(outcomes, "rpm-tenant", 0, w, rpm=args.quota_rpm),
           "tpm": flow_stats.quota_check(outcomes, "tpm-tenant", 0, w, tpm=args.quota_tpm),
           "openai_client": client,
           "num_unexplained": sum(o.is_unexplained for o in outcomes)}
    for key, tenant, kind in (("rpm", "rpm-tenant", "requests"), ("tpm", "tpm-tenant", "tokens")):
        first = next((o for o in outcomes if o.tenant == tenant and o.status == 429), None)
        out[key]["refusal_shape"] = flow_stats.is_openai_rate_limit(first, kind) if first else {}
        out[key]["refusal_example"] = ({"error": first.error, "headers": first.headers}
                                       if first else None)
    return out


def figures(args, reps: dict[str, list[dict]]) -> dict[str, Any]:
    """Medians with spread over repetitions, and each target met or not."""
    f: dict[str, Any] = {}
    if rows := reps.get("isolation"):
        f["isolation"] = flow_stats.isolation_figures(rows) | {
            "b_decode_p50_ms": spread(r["flood"]["tenants"]["B"]["decode_p50_ms"] for r in rows)}
    if rows := reps.get("fair"):
        f["fair"] = flow_stats.fair_figures(rows)
    if rows := reps.get("priority"):
        f["priority"] = flow_stats.priority_figures(rows)
    if rows := reps.get("quota"):
        f["quota"] = {}
        for key in ("rpm", "tpm"):
            served = spread(r[key]["served_over_limit"] for r in rows)
            f["quota"][key] = {
                "served_over_limit": served,
                "is_limit_met": abs(served["median"] - 1) <= TARGETS["quota_rel_error"]
                and all(abs(r[key]["served_over_limit"] - 1) <= TARGETS["quota_rel_error"]
                        for r in rows),
                "is_openai_shape": all(r[key]["refusal_shape"]
                                       and all(r[key]["refusal_shape"].values()) for r in rows),
                "num_429": sum(r[key]["num_429"] for r in rows),
            }
        f["quota"]["openai_client_raises"] = all(r["openai_client"]["raises_rate_limit_error"]
                                                 for r in rows)
    if rows := reps.get("waiting"):
        f["waiting"] = {
            "num_ok": sum(r["is_ok"] for r in rows), "num_tries": len(rows),
            "latency_s": spread(r["latency_s"] for r in rows),
            "port_open_after_start_s": spread(r["port_open_after_start_s"] for r in rows),
            "is_no_replica_ready_at_send": all(
                r["health_at_open"].get("num_healthy") == 0 for r in rows),
            "is_url_printed_early": any(r["is_url_printed_before_announcement"] for r in rows),
        }
    return f


def num_unexplained(reps: dict[str, list[dict]]) -> int:
    """Requests neither served nor refused with 429/503 and a reason, in every run."""
    total = 0
    for name, rows in reps.items():
        for r in rows:
            if name in ("isolation", "priority"):
                total += r["alone"]["num_unexplained"] + r["flood"]["num_unexplained"]
            elif name == "fair":
                total += r["run"]["num_unexplained"]
            elif name == "quota":
                total += r["num_unexplained"]
            elif name == "waiting":
                total += 0 if r["is_ok"] or r["drop_reason"] else 1
    return total


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    loadgen.install_uvloop()
    pin_client(args)
    shape = EngineShape(args.num_engines, args.max_num_seqs, args.step_ms,
                        args.prefill_us_per_token)
    started = time.time()
    reps: dict[str, list[dict]] = {s: [] for s in args.scenario_list}
    with tempfile.TemporaryDirectory(prefix="kvfleet-flow-") as tmp:
        workdir = Path(tmp)
        live = [s for s in args.scenario_list if s != "waiting"]
        engines, urls = (flow_fleet.start_engines(shape, workdir, args.router_cpu_pin)
                         if live else ([], []))
        try:
            for rep in range(args.reps):
                capacity_tps = None
                for name in args.scenario_list:
                    t = time.time()
                    if name == "isolation":
                        row = isolation(args, urls, workdir, rep)
                        note = f"A p90 ratio {row['ttft_p90_ratio']:.2f}, A lost {row['a_lost']}"
                    elif name == "fair":
                        row = fair(args, urls, workdir, rep)
                        capacity_tps = row["capacity_tokens_per_s"]
                        note = (f"max rel error {row['shares']['max_rel_error']:.3f}, jain "
                                f"{row['shares']['jain_equal_weight']['1']:.3f}")
                    elif name == "priority":
                        row = priority(args, urls, workdir, rep, capacity_tps)
                        note = f"crit p99 ratio {row['ttft_p99_ratio']:.2f}"
                    elif name == "quota":
                        row = quota(args, urls, workdir, rep)
                        note = (f"rpm {row['rpm']['served_over_limit']:.3f}, tpm "
                                f"{row['tpm']['served_over_limit']:.3f} of the limit")
                    else:
                        row = flow_fleet.first_request_at_port_open(workdir, args.router_cpu_pin)
                        note = f"status {row['status']} in {row['latency_s']:.2f}s"
                    reps[name].append(row)
                    print(f"rep {rep} {name:<9} {note} ({time.time() - t:.0f}s)", flush=True)
        finally:
            for proc in engines:
                procs.stop(proc)
    result = {
        "meta": {
            "command": "python bench/flow_control.py " + " ".join(
                sys.argv[1:] if argv is None else argv),
            "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "wall_s": time.time() - started,
            "is_pinned": not args.no_pin,
            "git": git_state(),
            "args": {k: v for k, v in vars(args).items() if k != "scenario_list"},
            "engine_profile": shape.profile(),
            "targets": TARGETS,
        },
        "figures": figures(args, reps),
        "num_unexplained": num_unexplained(reps),
        "reps": reps,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["figures"], indent=1))
    print(f"requests neither served nor refused with a reason: {result['num_unexplained']}")
    print(f"wrote {out}")
    refresh_section("flow_control", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
