"""Chaos soak: steady load through a local fleet while a seeded schedule breaks it.

    python bench/chaos.py --seed 1 --duration 600 --faults 50

A `kvfleet up` fleet of three simulated-runner engines and its router, plus a second router
replica run here (a local fleet runs one router) with a fault proxy in front of one engine,
serve a fixed rate of streamed and plain completions and chat requests, round-robin over
the two routers. The schedule (kvfleet_bench/chaos/schedule.py) SIGKILLs and hangs engines,
SIGKILLs router replica A and the control loop, and makes the proxied path slow, dropping,
truncating or answering garbage metrics. Each request's outcome is charged to the fault
active when it failed; each fault's recovery runs until the fleet serves at full capacity
again. After the run: no process, port, drain or stale router config may be left.

Writes bench/results/chaos_seed<SEED>.json (elsewhere with --out) and its README section.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvfleet_bench import readme
from kvfleet_bench.chaos import schedule as sch
from kvfleet_bench.chaos.soak import SoakConfig, run_soak
from kvfleet_bench.procs import REPO_DIR, RESULTS_DIR

POOL = Path(__file__).resolve().parent / "kvfleet_bench" / "chaos" / "pool.yaml"


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=REPO_DIR, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--faults", type=int, default=50, help="faults in the schedule")
    p.add_argument("--rate", type=float, default=4.0, help="requests per second")
    p.add_argument("--kinds", default=",".join(sch.KINDS),
                   help=f"comma-separated fault kinds (default all: {','.join(sch.KINDS)})")
    p.add_argument("--out", type=Path, help="results file (default bench/results/"
                   "chaos_seed<SEED>.json)")
    p.add_argument("--work-dir", type=Path, help="state and logs (default: a temp dir)")
    args = p.parse_args(argv)
    kinds = tuple(k for k in args.kinds.split(",") if k)
    try:
        sch.make_schedule(args.seed, args.duration, args.faults, num_engines=3, hang_s=1.0,
                          kinds=kinds)
    except sch.ScheduleError as exc:
        p.error(str(exc))
    if args.rate <= 0:
        p.error("--rate must be positive")
    out = args.out or RESULTS_DIR / f"chaos_seed{args.seed}.json"
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kvfleet-chaos-"))
    cfg = SoakConfig(pool=POOL, work_dir=work, seed=args.seed, duration_s=args.duration,
                     num_faults=args.faults, rate=args.rate, kinds=kinds,
                     say=lambda line: print(line, flush=True))
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    commit = _commit()  # what ran, not what was committed while it ran
    result = asyncio.run(run_soak(cfg))
    result["summary"].update(
        seed=args.seed, duration_s=args.duration, date=started, commit=commit,
        command=f"python bench/chaos.py --seed {args.seed} --duration {args.duration:g} "
                f"--faults {args.faults} --rate {args.rate:g}",
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    print(f"wrote {out} (logs in {work})")
    readme.refresh_section("chaos", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
