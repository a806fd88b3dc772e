"""Candidate routing policies on the simulator's model of bench/router_cache_hits.py.

The live replay of Mooncake through N fake backends with LRU-bounded caches takes about a
minute per router and repetition; the simulator's model of it (`sim/pools/fake-backends.yaml`,
`kvfleet_sim.fake_backend`, the real RouterCore; agreement with the live replay within 10%
is checked by `bench/sim_fidelity.py --routing`) takes about a second per seed. This runs
candidates over many seeds and several slices, so a default can be chosen on one slice and
checked on the others before it is measured live:

    .venv/bin/python bench/sim_router_hits.py --pipelines \\
        '{"space": {"scorers": {"prefix": 1, "queue": 4, "space": 0.01}, "guard": true}}'

Policies: `--policy` names (kvfleet's presets and `sgl-cache-aware`, the simulator's model
of sglang-router's rule), plus each pipeline of `--pipelines` (a pool copy with
`routing.policy: pipeline`). Slices: `--slice SKIP:BACKENDS` (trace lines skipped, backends);
the first is the training slice of the live bench, the rest those bench/README.md reports
as held-out. Cells: median (min-max) over seeds of the hit fraction, and the median
backends per shared prefix. Writes bench/results/sim_router_hits.json and .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from kvfleet_bench import routing_fidelity
from kvfleet_bench import traces as trace_mooncake
from kvfleet_bench.cache_replay import add_scenario_args, git_state, pipelines_arg
from kvfleet_bench.procs import RESULTS_DIR
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.sections.sim_router_hits import results_markdown

SLICES = ("0:4", "2000:4", "4000:4", "6000:4", "8000:4", "10500:4", "0:8", "6000:8")
POLICIES = ("cache-aware", "sgl-cache-aware")


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawTextHelpFormatter)
    add_scenario_args(p, "unused here")
    p.add_argument("--policy", action="append", default=None,
                   help=f"repeatable; default: {', '.join(POLICIES)}")
    p.add_argument("--pipelines", type=pipelines_arg, default={}, metavar="JSON",
                   help="name -> routing pipeline (router/README.md), each run as a pool's "
                        "routing.pipeline")
    p.add_argument("--slice", action="append", default=None, metavar="SKIP:BACKENDS")
    p.add_argument("--seeds", type=int, default=21)
    p.add_argument("--step-ms", type=float, default=1.0,
                   help="the simulated fake backend's longest step, virtual ms")
    p.add_argument("--out", type=Path, default=RESULTS_DIR / "sim_router_hits.json")
    args = p.parse_args(argv)
    args.policies = args.policy or list(POLICIES)
    try:
        args.slices = [tuple(int(x) for x in s.split(":")) for s in args.slice or SLICES]
    except ValueError:
        p.error("--slice is SKIP:BACKENDS, two integers")
    if args.seeds < 1 or any(len(s) != 2 or s[0] < 0 or s[1] < 1 for s in args.slices):
        p.error("--seeds and the slices' backends must be positive, skips at least 0")
    return args


def pipeline_pool(name: str, pipeline: dict[str, Any], workdir: Path) -> Path:
    doc = yaml.safe_load(routing_fidelity.POOL.read_text())
    doc["spec"]["routing"] = {"policy": "pipeline", "pipeline": pipeline}
    out = workdir / f"fake-backends-{name}.yaml"
    out.write_text(yaml.safe_dump(doc, sort_keys=False))
    return out


def run_slice(args: argparse.Namespace, skip: int, backends: int,
              runs: dict[str, tuple[str | None, Path]]) -> dict[str, Any]:
    scenario = argparse.Namespace(**{**vars(args), "skip": skip, "num_backends": backends})
    requests = trace_mooncake.load(args.trace, args.num_requests, args.speedup, skip)
    trace = routing_fidelity.sim_trace(requests, scenario)
    rows = {}
    for label, (policy, pool) in runs.items():
        seeds = [routing_fidelity.run_sim(policy, trace, requests, scenario, seed, pool)
                 for seed in range(args.seeds)]
        hits = [r["hit_fraction"] for r in seeds]
        rows[label] = {"hit_fraction": hits, "backends_per_shared_prefix": statistics.median(
            r["mean_backends_per_shared_prefix"] for r in seeds)}
        print(f"skip {skip:>6} x{backends}  {label:<20} hit {statistics.median(hits):.4f} "
              f"({min(hits):.4f}-{max(hits):.4f})", flush=True)
    return {"skip": skip, "num_backends": backends, "rows": rows}


def main(argv: list[str]) -> int:
    args = parse(argv)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="sim-router-hits-") as tmp:
        runs: dict[str, tuple[str | None, Path]] = {
            p: (p, routing_fidelity.POOL) for p in args.policies}
        for name, pipeline in args.pipelines.items():
            runs[name] = (None, pipeline_pool(name, pipeline, Path(tmp)))
        slices = [run_slice(args, skip, n, runs) for skip, n in args.slices]
    out = {"command": "python bench/sim_router_hits.py " + " ".join(argv),
           "commit": git_state()["commit"][:10], "seeds": args.seeds,
           "wall_s": time.time() - started, "slices": slices}
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(results_markdown(out))
    print(f"wrote {args.out} (+ .md)")
    refresh_section("sim_router_hits", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
