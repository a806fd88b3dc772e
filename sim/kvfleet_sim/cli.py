"""`kvfleet sim`: replay a trace through a simulated fleet in virtual time, once per scaler.

    kvfleet sim --trace ../shared/traces/azure_llm_2023_conv.csv --pool examples/local-sim.yaml

Bad flags, an unreadable trace or an invalid pool end with one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kvfleet_sim.fleet import SimError, SimSettings
from kvfleet_sim.report import Summary
from kvfleet_sim.run import SimRun, run_scalers
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceError


class CLIError(Exception):
    """A one-line, user-facing reason to stop."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CLIError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvfleet sim", description=__doc__.splitlines()[0])
    p.add_argument("--trace", required=True, help="Azure LLM trace CSV")
    p.add_argument("--pool", required=True, help="InferencePool YAML (builtin, simulated)")
    p.add_argument("--scaler", action="append", choices=sorted(SCALERS),
                   help="repeatable; default: all of them")  # fmt: skip
    p.add_argument("--start-s", type=float, default=1800.0, help="slice start in the trace")
    p.add_argument("--duration-s", type=float, default=600.0, help="measured slice length")
    p.add_argument("--warmup-s", type=float, default=120.0,
                   help="trace time replayed before the slice, not measured")  # fmt: skip
    p.add_argument("--compress", type=float, default=4.0, help="time compression factor")
    p.add_argument("--startup-s", type=float, default=10.0, help="replica provisioning time")
    p.add_argument("--ttft-slo", type=float, default=None, help="default: the pool's target")
    p.add_argument("--itl-slo", type=float, default=None, help="default: pool's, else 0.05")
    p.add_argument("--json", default=None, help="write summaries and timelines here")
    p.add_argument("--plot", default=None, help="write a replicas-over-time PNG here")
    return p


def format_table(summaries: list[Summary], ttft_slo: float, itl_slo: float) -> str:
    head = (
        f"| scaler | SLO met (TTFT<={ttft_slo:g}s, ITL<={itl_slo * 1000:g}ms) "
        "| TTFT p50 / p90 / p99 (s) | ITL p50 / p90 (ms) | replica-s | mean / max replicas "
        "| scale events | failed |"
    )
    rows = [head, "|" + "---|" * 8]
    for s in summaries:
        rows.append(
            f"| {s.scaler} | {s.slo_attainment:.1%} | {s.ttft_p50_s:.2f} / {s.ttft_p90_s:.2f} / "
            f"{s.ttft_p99_s:.2f} | {s.itl_p50_s * 1000:.1f} / {s.itl_p90_s * 1000:.1f} | "
            f"{s.replica_seconds:.0f} | {s.mean_replicas:.2f} / {s.max_replicas} | "
            f"{s.num_scale_events} | {s.num_failed} |"
        )
    return "\n".join(rows)


def write_plot(path: str, runs: list[SimRun], start_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    styles = ["-", "--", ":", "-."]
    for i, run in enumerate(runs):
        pts = [(t - start_s, p) for t, p, _ in run.result.timeline if t >= start_s]
        ax.step([t for t, _ in pts], [p for _, p in pts], where="post", label=run.name,
                linestyle=styles[i % len(styles)], linewidth=2.5 - 0.5 * i)  # fmt: skip
    ax.set_xlabel("virtual seconds into the measured slice")
    ax.set_ylabel("replicas provisioned")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
        started = time.perf_counter()
        runs, ttft_slo, itl_slo = run_scalers(
            trace_path=args.trace, pool_path=args.pool, scalers=args.scaler or list(SCALERS),
            start_s=args.start_s, duration_s=args.duration_s, warmup_s=args.warmup_s,
            compress=args.compress, settings=SimSettings(startup_s=args.startup_s),
            ttft_slo_s=args.ttft_slo, itl_slo_s=args.itl_slo,
        )  # fmt: skip
    except (CLIError, SimError, TraceError, ValueError, OSError) as exc:
        print(f"kvfleet sim: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    summaries = [r.summary for r in runs]
    print(format_table(summaries, ttft_slo, itl_slo))
    print(f"({len(runs)} runs in {time.perf_counter() - started:.0f} s wall)")
    if args.json:
        out = {"args": vars(args), "ttft_slo_s": ttft_slo, "itl_slo_s": itl_slo,
               "runs": [r.to_dict() for r in runs]}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.plot:
        write_plot(args.plot, runs, runs[0].start_s if runs else 0.0)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
