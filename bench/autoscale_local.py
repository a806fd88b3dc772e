"""Autoscaling evaluation: kvfleet's autoscaler vs a fixed-max fleet vs the KEDA
"waiting > 5 per replica" rule, on one 10-minute slice of the Azure conversation trace.

    .venv/bin/python bench/autoscale_local.py            # about 3 minutes on 2 cores

Runs `kvfleet sim` (sim/kvfleet_sim) once per scaler over the same requests, in virtual
time: the real engine scheduler/KV cache per replica with the h100-llama3-8b cost model,
the real router policy, and the operator's signals/reconcile/autoscaler. Writes
bench/results/autoscale_local.json and .png, and prints the markdown table that
bench/README.md quotes.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvfleet_bench.readme import refresh_section

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"
RESULTS = ROOT / "bench" / "results"


def main(argv: list[str]) -> int:
    from kvfleet_sim.cli import main as sim_main

    trace = TRACE if TRACE.exists() else Path("/work/shared/traces/azure_llm_2023_conv.csv")
    RESULTS.mkdir(exist_ok=True)
    args = [
        "--trace", str(trace),
        "--pool", str(ROOT / "examples" / "local-sim.yaml"),
        "--start-s", "1800", "--duration-s", "600", "--warmup-s", "120", "--compress", "4",
        "--startup-s", "10",
        "--json", str(RESULTS / "autoscale_local.json"),
        "--plot", str(RESULTS / "autoscale_local.png"),
    ]  # fmt: skip
    rc = sim_main(args + argv)
    refresh_section("autoscale_local", RESULTS / "autoscale_local.json")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
