"""bench/sim_scale.py: the full Mooncake trace twice, and a 1,000-replica fleet."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code, pct, table
from kvfleet_bench.sections.sim_policies import _short

FILES = ("sim_scale", "sim_scale_fleet1000")

_COMMANDS = {
    "sim_scale": ".venv/bin/python bench/sim_scale.py --only mooncake    # the full Mooncake "
                 "trace, twice",
    "sim_scale_fleet1000": ".venv/bin/python bench/sim_scale.py --only fleet-1000 "
                           "--out bench/results/sim_scale_fleet1000.json",
}


def _load(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def render_sim_scale(results: dict[str, Any]) -> str:
    out = [code(".venv/bin/python bench/sim_scale.py                    # both checks",
                *(_COMMANDS[stem] for stem in results))]
    for stem, r in results.items():
        for check, c in r["checks"].items():
            runs = c["runs"]
            rows = []
            for i, run in enumerate(runs):
                s = run["summary"]
                note = ""
                if i and c.get("is_bit_identical") is not None:
                    note = ("byte-identical JSON to run 1" if c["is_bit_identical"]
                            else "**JSON differs from run 1**")
                rows.append([i + 1, f"{s['num_requests']:,}", f"{run['wall_s']:.1f}",
                             f"{run['cpu_s']:.1f}", f"{run['peak_rss_mb']:,}",
                             pct(1)(s["slo_attainment"]), s["num_failed"], note])
            commands = sorted({" ".join(map(_short, run["command"].split())) for run in runs})
            out += ["", f"**{check}** (`bench/results/{stem}.json`; load average before "
                        f"{_load(r['load_before'])}, after {_load(r['load_after'])}; the results "
                        f"record no commit or date):", "",
                    table(["run", "requests", "wall (s)", "CPU (s)", "peak RSS (MB)", "SLO met",
                           "failed", "note"], rows), "",
                    *(f"`{command}`" for command in commands)]
    return "\n".join(out)
