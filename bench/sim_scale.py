"""The simulator at the sizes users run: wall time, peak memory and reproducibility.

    .venv/bin/python bench/sim_scale.py                 # both checks, ~15 min on 2 cores
    .venv/bin/python bench/sim_scale.py --only mooncake # or --only fleet-1000

* mooncake:   the full Mooncake conversation trace (12,031 requests, 59 min) over the
              16-replica unified pool, twice with the same seed; the two JSON results
              must be byte-identical.
* fleet-1000: 1,000 replicas (sim/pools/h100-llama3-8b-1000.yaml) on the Azure
              conversation trace at 50x its request rate: 1 min of warm-up and 5 min
              measured from minute 30, with kvfleet's autoscaler, signals and reconcile
              running over the whole fleet.

Each run is its own `kvfleet sim run` process; its wall time and peak RSS (from wait4)
are reported. Results: bench/results/sim_scale.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from kvfleet_bench.procs import REPO_DIR as ROOT
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.report import write_report

TRACES = ROOT.parent / "shared" / "traces"
KVFLEET = str(ROOT / ".venv" / "bin" / "kvfleet")


def mooncake_args() -> list[str]:
    return ["--trace", str(TRACES / "mooncake_conversation.jsonl"),
            "--pool", "sim/pools/h100-llama3-8b-16.yaml", "--start-s", "0", "--warmup-s", "0",
            "--duration-s", "3600", "--compress", "1", "--scaler", "fixed-max"]  # fmt: skip


def fleet_1000_args() -> list[str]:
    return ["--trace", str(TRACES / "azure_llm_2023_conv.csv"),
            "--pool", "sim/pools/h100-llama3-8b-1000.yaml", "--start-s", "1800",
            "--warmup-s", "60", "--duration-s", "300", "--compress", "1", "--rate", "50",
            "--scaler", "kvfleet"]  # fmt: skip


def timed_run(args: list[str], out_json: Path) -> dict[str, Any]:
    """One `kvfleet sim run` in a child process: wall seconds, peak RSS, its summary."""
    cmd = [KVFLEET, "sim", "run", *args, "--seed", "0", "--json", str(out_json),
           "--no-progress"]  # fmt: skip
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"sim_scale: the run exited {proc.returncode}")
    result = json.loads(out_json.read_text())
    summary = result["runs"][0]["summary"]
    return {"command": " ".join(["kvfleet", *cmd[1:-3]]), "wall_s": round(wall, 1),
            "peak_rss_mb": round(usage.ru_maxrss / 1024), "cpu_s": round(
                usage.ru_utime + usage.ru_stime, 1), "summary": summary}  # fmt: skip


def check_mooncake(tmp: Path) -> dict[str, Any]:
    first = timed_run(mooncake_args(), tmp / "a.json")
    second = timed_run(mooncake_args(), tmp / "b.json")
    same = (tmp / "a.json").read_bytes() == (tmp / "b.json").read_bytes()
    return {"runs": [first, second], "is_bit_identical": same,
            "num_requests": first["summary"]["num_requests"]}  # fmt: skip


def check_fleet_1000(tmp: Path) -> dict[str, Any]:
    return {"runs": [timed_run(fleet_1000_args(), tmp / "c.json")]}


def to_markdown(result: dict[str, Any]) -> str:
    lines = ["| check | requests | wall (s) | CPU (s) | peak RSS (MB) | SLO met | note |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, check in result["checks"].items():
        for i, run in enumerate(check["runs"]):
            s = run["summary"]
            note = ""
            if "is_bit_identical" in check and i == 1:
                note = "byte-identical to run 1" if check["is_bit_identical"] else "DIFFERS"
            lines.append(f"| {name} | {s['num_requests']} | {run['wall_s']} | {run['cpu_s']} "
                         f"| {run['peak_rss_mb']} | {s['slo_attainment']:.1%} | {note} |")
    cmds = sorted({run["command"] for c in result["checks"].values() for run in c["runs"]})
    return "\n".join(lines + ["", *[f"`{c}`" for c in cmds]]) + "\n"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", choices=("mooncake", "fleet-1000"), default=None)
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "sim_scale.json"))
    args = p.parse_args()
    checks = {"mooncake": check_mooncake, "fleet-1000": check_fleet_1000}
    result: dict[str, Any] = {"load_before": os.getloadavg(), "checks": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, check in checks.items():
            if args.only in (None, name):
                result["checks"][name] = check(Path(tmp))
    result["load_after"] = os.getloadavg()
    text = to_markdown(result)
    write_report(Path(args.out), result, text)
    print(text)
    refresh_section("sim_scale", args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
