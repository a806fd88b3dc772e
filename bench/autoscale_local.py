"""Autoscaling evaluation: kvfleet's autoscaler vs a fixed-max fleet vs the KEDA
"waiting > 5 per replica" rule and the simulator's other baselines, on one 10-minute slice
of the Azure conversation trace through the shipped `examples/local-sim.yaml` pool.

    .venv/bin/python bench/autoscale_local.py              # about a minute on 2 cores
    .venv/bin/python bench/autoscale_local.py --held-out   # the same on other slices, ~5 min

Runs `kvfleet sim` (sim/kvfleet_sim) once per scaler over the same requests, in virtual
time: the real engine scheduler/KV cache per replica with the h100-llama3-8b cost model,
the real router policy, and the operator's signals/reconcile/autoscaler. Writes
bench/results/autoscale_local.json and .png, and prints the markdown table that
bench/README.md quotes. `--held-out` replays the pool on slices no default was tuned on
(HELD_OUT: other times of the conversation trace, and the code trace) and writes
bench/results/autoscale_local_heldout.json, a second table in the same README section.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from kvfleet_bench.readme import refresh_section

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
if not TRACES.is_dir():  # a checkout outside the workspace
    TRACES = Path("/work/shared/traces")
RESULTS = ROOT / "bench" / "results"
POOL = ROOT / "examples" / "local-sim.yaml"
SLICE = ("azure_llm_2023_conv.csv", 1800)
# Chosen after the pool's defaults were set, none of them looked at before: the
# conversation trace earlier and later than SLICE, and the code trace's two autoscaler
# slices (bench/sim_policies.md) at this pool's compression.
HELD_OUT = (("azure_llm_2023_conv.csv", 600), ("azure_llm_2023_conv.csv", 2400),
            ("azure_llm_2023_conv.csv", 3000), ("azure_llm_2023_code.csv", 900),
            ("azure_llm_2023_code.csv", 2400))


def slice_args(trace: str, start_s: int) -> list[str]:
    return ["--trace", str(TRACES / trace), "--pool", str(POOL), "--start-s", str(start_s),
            "--duration-s", "600", "--warmup-s", "120", "--compress", "4",
            "--startup-s", "10"]  # fmt: skip


def held_out(argv: list[str]) -> int:
    from kvfleet_sim.cli import main as sim_main

    slices = []
    with tempfile.TemporaryDirectory() as tmp:
        for trace, start_s in HELD_OUT:
            out = Path(tmp) / f"{Path(trace).stem}-{start_s}.json"
            rc = sim_main([*slice_args(trace, start_s), "--json", str(out), *argv])
            if rc:
                return rc
            slices.append(json.loads(out.read_text()))
    path = RESULTS / "autoscale_local_heldout.json"
    path.write_text(json.dumps({"slices": [
        {"args": s["args"], "ttft_slo_s": s["ttft_slo_s"], "itl_slo_s": s["itl_slo_s"],
         "summaries": [run["summary"] for run in s["runs"]]} for s in slices]}, indent=1))
    refresh_section("autoscale_local", path)
    return 0


def main(argv: list[str]) -> int:
    from kvfleet_sim.cli import main as sim_main

    RESULTS.mkdir(exist_ok=True)
    if "--held-out" in argv:
        return held_out([a for a in argv if a != "--held-out"])
    args = [
        *slice_args(*SLICE),
        "--json", str(RESULTS / "autoscale_local.json"),
        "--plot", str(RESULTS / "autoscale_local.png"),
    ]  # fmt: skip
    rc = sim_main(args + argv)
    refresh_section("autoscale_local", RESULTS / "autoscale_local.json")
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
