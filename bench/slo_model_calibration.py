"""Does the autoscaler's SLO model know what N replicas serve? Its calibration, in the simulator.

The SLO-driven autoscaler (operator `decide/slo_sizing.py`) asks the routers' perf model
how many replicas meet the pool's TTFT and ITL targets. Where that model is wrong, the
observed-latency cap takes over, and the cap's holds are what cost replica-seconds on bursty
traffic (bench/README.md). This measures how wrong the model is, per trace slice:

* the simulator replays the slice with the pool's one role pinned at N replicas (the pool's
  own routing; the pool's scaler does not run);
* at every control-loop tick in the measured window the SLO sizing is asked, with the perf
  model the routers learned in that run and the signals the autoscaler would read
  (`role_load`: rate, queue, tokens per request, burst rate), what a request would see on
  one of N replicas (`predict`, at the p90) and how many replicas it would size for
  (`size`, at the pool's targets, as the autoscaler asks);
* each row gives the measured TTFT p90, ITL p90 and SLO attainment at N beside the
  predictions over those ticks (ticks with load and the fleet's own fit): their p50 and
  p90, the p90 being what the autoscaler's scale-down hold keeps of its asks.

The last lines compare the model's ask with the smallest N whose measured TTFT p90 and
ITL p90 met the targets, and with the smallest N whose attainment reached the tables' bar;
the slice's header gives the p90 of its requests' solo TTFT (each prompt prefilled alone on
an idle replica with an empty cache), the TTFT p90 that no replica count goes below
without prefix hits.

    .venv/bin/python bench/slo_model_calibration.py   # bench/results/slo_model_calibration.*
    .venv/bin/python bench/slo_model_calibration.py --quick  # seconds; what tests/bench runs

Unified pools only: a P/D pool's roles load each other (a decode role's count changes what
its prefill role's legs see), which one pinned count per run cannot separate.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvfleet_bench.cache_replay import git_state
from kvfleet_bench.procs import RESULTS_DIR
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.sections.slo_model_calibration import results_markdown
from kvfleet_bench.stats import mean, percentile
from kvfleet_operator.decide.autoscaler_spec import config_from_pool
from kvfleet_operator.decide.slo_sizing import (
    RoleLoad,
    choose_coefficients,
    predict,
    role_load,
    seed_coefficients,
    size,
)
from kvfleet_router.perf_model import RoleCoefficients, dot, ttft_features
from kvfleet_sim.fleet import FleetSim, SimSettings
from kvfleet_sim.report import summarize
from kvfleet_sim.run import Variant, load_slice
from kvfleet_sim.scalers import SCALERS, SimScaler

REPO = Path(__file__).resolve().parents[1]
TRACES = REPO.parent / "shared" / "traces"
# (label, trace file, slice start s, pool, counts): the slices the autoscaler tables'
# training rows use, each over the counts between the model's asks and the pool's maximum.
SLICES = (
    ("Mooncake conversation", "mooncake_conversation.jsonl", 900.0,
     "sim/pools/h100-llama3-8b-32.yaml", (4, 8, 12, 16, 24, 32)),
    ("Azure code", "azure_llm_2023_code.csv", 900.0,
     "sim/pools/h100-llama3-8b-16.yaml", (1, 2, 3, 4, 6, 8)),
)
QUICK = (("Azure code", "azure_llm_2023_code.csv", 900.0,
          "sim/pools/h100-llama3-8b-16.yaml", (1, 2)),)
PREDICT_QUANTILE = 0.9  # the measured figures are p90s
SIZE_LIMIT = 256  # replicas the model may ask for, past any pool's maximum


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--warmup-s", type=float, default=300.0)
    p.add_argument("--duration-s", type=float, default=600.0)
    p.add_argument("--startup-s", type=float, default=10.0)
    p.add_argument("--bar", type=float, default=None,
                   help="the attainment a count must reach for the last line (default: "
                        "0.99, or the slice's ceiling less 0.5 point where prompts alone "
                        "exceed the TTFT target)")
    p.add_argument("--quick", action="store_true",
                   help="one short Azure code slice at two counts (seconds)")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "slo_model_calibration.json")
    args = p.parse_args(argv)
    if args.quick:
        args.warmup_s, args.duration_s = 60.0, 120.0
    if not (args.warmup_s >= 0 and args.duration_s > 0 and args.startup_s >= 0):
        p.error("--warmup-s and --startup-s must be >= 0, --duration-s > 0")
    return args


def quantiles(values: list[float]) -> dict[str, float] | None:
    """p50, p90 and max of the finite `values` (nearest rank), with how many were not."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None
    return {"p50": percentile(finite, 50), "p90": percentile(finite, 90), "max": max(finite),
            "num_infeasible": len(values) - len(finite)}


def run_count(pool_path: Path, trace: list[Any], count: int, args: argparse.Namespace
              ) -> dict[str, Any]:
    """One replay pinned at `count`, with the SLO model asked at every measured tick."""
    variant = Variant(str(pool_path), scaler="fixed-max", replicas=count)
    pool = variant.load()
    FleetSim.check_pool(pool)
    roles = list(pool.spec.topology.roles())
    if roles != ["unified"]:
        raise SystemExit(f"{pool_path}: a unified pool is needed, roles are {roles}")
    config = config_from_pool(pool.spec)
    targets = config.targets["unified"]
    if targets.slo is None:
        raise SystemExit(f"{pool_path}: the pool sets no SLO (ttftP90Seconds / itlP90Seconds)")
    slo = targets.slo
    seed = config.perf_seed.get("unified") or seed_coefficients()
    measure_from, measure_to = args.warmup_s, args.warmup_s + args.duration_s
    ticks: list[dict[str, Any]] = []
    fixed = SCALERS["fixed-max"](pool.spec)

    def scaler(stable: Any, panic: Any, current: dict[str, int], history: Any,
               now: float) -> Any:
        rs = stable.roles.get("unified")
        if rs is not None and rs.num_known and measure_from <= now < measure_to:
            weights, source = choose_coefficients(rs.perf, seed)
            load = role_load(rs, config.backlog_clear_s, "unified")
            p = predict(weights, load, count, PREDICT_QUANTILE)
            asked, _why = size(weights, load, slo, SIZE_LIMIT, "unified")
            shared = shared_ttft_s(weights, load, count, PREDICT_QUANTILE)
            ticks.append({"t": now, "ttft_p90_s": p.ttft_p90_s, "itl_p90_s": p.itl_p90_s,
                          "ttft_p90_shared_s": math.nan if shared is None else shared,
                          "asked": asked, "is_fleet_model": source.startswith("fleet model"),
                          "request_rate": load.request_rate,
                          "uncached_prompt_tokens": load.uncached_prompt_tokens})
        return fixed.scaler(stable, panic, current, history, now)

    settings = SimSettings(startup_s=args.startup_s, measure_from_s=measure_from,
                           run_until_s=measure_to)
    sim = FleetSim(pool, SimScaler(scaler, initial=fixed.initial), settings)
    result = sim.run(trace)
    # measured against the targets the sizing checks (the router's default for one unset)
    ttft_slo, itl_slo = slo.ttft_p90_s, slo.itl_p90_s
    assert ttft_slo is not None and itl_slo is not None  # a unified role checks both
    summary = summarize(f"fixed at {count}", result, ttft_slo, itl_slo, measure_from,
                        measure_to)
    # ticks with load and the fleet's own fit: an idle window asks for nothing either way
    learned = [t for t in ticks if t["is_fleet_model"] and t["request_rate"] > 0]
    return {
        "count": count,
        "measured": {"ttft_p90_s": summary.ttft_p90_s, "itl_p90_s": summary.itl_p90_s,
                     "slo_attainment": summary.slo_attainment,
                     "prefix_hit_rate": summary.prefix_hit_rate,
                     "num_requests": summary.num_requests},
        "num_ticks": len(ticks), "num_ticks_fleet_model": len(learned),
        "predicted": {key: quantiles([t[key] for t in learned])
                      for key in ("ttft_p90_s", "ttft_p90_shared_s", "itl_p90_s", "asked",
                                  "request_rate", "uncached_prompt_tokens")},
        "slo": {"ttft_p90_s": ttft_slo, "itl_p90_s": itl_slo},
    }


def shared_ttft_s(weights: RoleCoefficients, load: RoleLoad, num_replicas: int,
                  q: float) -> float | None:
    """A candidate for the sizing's TTFT, from what the routers export: the perf model's
    TTFT alone on a replica (nothing queued or running) of the routers' recent q-quantile
    uncached prompt, stretched by 1 / (1 - rho) as a processor-sharing queue stretches a
    job; rho = the role's request rate per replica x the model's prefill of the routers'
    recent mean prompt (its per-ktoken weight). inf at rho >= 1; None when the routers
    export no prompts."""
    ktokens, mean = weights.prompt_ktokens_at(q), weights.mean_prompt_ktokens
    if ktokens is None or mean is None:
        return None
    alone = dot(weights.ttft, ttft_features(1000.0 * ktokens, 0.0, 0.0, 0.0))
    rho = load.request_rate / num_replicas * max(0.0, weights.ttft[1] * mean)
    return alone / (1.0 - rho) if rho < 1.0 else math.inf


def prompt_tail(trace: list[Any], measure_from: float, measure_to: float) -> float:
    """The p90 prompt over the mean prompt of the measured requests (1 with none)."""
    prompts = [r.num_prompt_tokens for r in trace if measure_from <= r.t < measure_to]
    if not prompts or sum(prompts) <= 0:
        return 1.0
    return percentile(prompts, 90) / mean(prompts)


@dataclass(frozen=True, slots=True)
class PromptFloor:
    """What a slice's prompts cost alone: each prefilled on an idle replica with an empty
    cache (`kvfleet_sim.ceiling.solo_ttft_s`), over the measured requests."""

    bar: float  # 0.99, or the ceiling less half a point where prompts alone miss the target
    solo_p90_s: float  # the TTFT p90 no queue would add to
    solo_mean_s: float
    request_rate: float  # measured requests per second

    def shared_p90_s(self, num_replicas: int) -> float:
        """The reference a sizing model could aim for: the solo p90 stretched by 1 / (1 -
        rho), rho = rate per replica x mean solo prefill. An engine's token budget is
        shared by every prompt it has admitted (chunked prefill), so a prefill runs as in
        a processor-sharing queue, where a job of size x takes x / (1 - rho) on average
        whatever the sizes' spread (M/G/1-PS). Without prefix hits: above the measured
        where hits shorten prefills."""
        rho = self.request_rate / num_replicas * self.solo_mean_s
        return self.solo_p90_s / (1.0 - rho) if rho < 1 else math.inf


def prompt_floor(trace: list[Any], measure_from: float, measure_to: float,
                 ttft_slo_s: float) -> PromptFloor:
    """The slice's `PromptFloor`; the bar is bench/sim_policies.py's reading of issue 27."""
    from kvfleet_engine.runners.cost_model import load_profile
    from kvfleet_sim.ceiling import attainment_ceiling, solo_ttft_s

    profile = load_profile("h100-llama3-8b")
    measured = [r for r in trace if measure_from <= r.t < measure_to]
    ceiling = attainment_ceiling(measured, profile, 8192, ttft_slo_s)
    solo = [solo_ttft_s(profile, r.num_prompt_tokens, 8192) for r in measured]
    return PromptFloor(min(0.99, ceiling - 0.005), percentile(solo, 90), mean(solo),
                       len(measured) / (measure_to - measure_from))


def run_slice(spec: tuple[str, str, float, str, tuple[int, ...]],
              args: argparse.Namespace) -> dict[str, Any]:
    label, trace_name, start_s, pool, counts = spec
    trace = load_slice(str(TRACES / trace_name), start_s, args.duration_s, args.warmup_s,
                       1.0, 1.0)
    rows = []
    tail = prompt_tail(trace, args.warmup_s, args.warmup_s + args.duration_s)
    for n in counts:
        t0 = time.time()
        row = run_count(REPO / pool, trace, n, args)
        row["wall_s"] = time.time() - t0
        m, pr = row["measured"], row["predicted"]
        asked = pr["asked"]["p90"] if pr["asked"] else float("nan")
        print(f"{label:<22} N={n:<3} TTFT p90 {m['ttft_p90_s'] * 1000:7.0f} ms  ITL p90 "
              f"{m['itl_p90_s'] * 1000:5.1f} ms  SLO met {m['slo_attainment']:.1%}  model "
              f"asks (p90 of ticks) {asked:g}  ({row['wall_s']:.0f} s)", flush=True)
        rows.append(row)
    slo = rows[0]["slo"]
    floor = prompt_floor(trace, args.warmup_s, args.warmup_s + args.duration_s,
                         slo["ttft_p90_s"])
    for row in rows:
        row["shared_solo_ttft_p90_s"] = floor.shared_p90_s(row["count"])
    return {"label": label, "trace": trace_name, "start_s": start_s, "pool": pool,
            "bar": args.bar if args.bar is not None else floor.bar,
            "solo_ttft_p90_s": floor.solo_p90_s, "solo_ttft_mean_s": floor.solo_mean_s,
            "prompt_tail": tail,
            "rows": rows}


def main(argv: list[str]) -> int:
    args = parse(argv)
    started = time.time()
    slices = [run_slice(s, args) for s in (QUICK if args.quick else SLICES)]
    out = {"command": " ".join(["python bench/slo_model_calibration.py", *argv]),
           "commit": git_state()["commit"][:10],
           "warmup_s": args.warmup_s, "duration_s": args.duration_s,
           "startup_s": args.startup_s, "predict_quantile": PREDICT_QUANTILE,
           "wall_s": time.time() - started, "slices": slices}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(results_markdown(out))
    print(f"wrote {args.out} (+ .md)")
    refresh_section("slo_model_calibration", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
