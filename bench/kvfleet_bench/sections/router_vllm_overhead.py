"""bench/router_vllm_overhead.py: kvfleet's router in front of vLLM and of kvfleet's engine."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code

FILES = ("router_vllm_overhead",)

# the tables are also those bench/router_vllm_overhead.py writes beside its JSON and prints


def fmt(s: dict[str, float], digits: int = 1) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def results_markdown(result: dict) -> str:
    """A run's tables, from its result JSON (also what the script writes as .md)."""
    sides = result["conformance"]
    names = list(sides)
    lines = [f"Run: `{result['command']}`, started {result['started']}, {result['rounds']} rounds "
             f"x {result['requests']} requests per cell, max_tokens {result['max_tokens']} (EOS "
             f"ignored, temperature 0), policy {result['policy']}, pinned: {result['pinned']}, "
             f"load average at start {result['loadavg']} on {result['num_cpus']} cores.", "",
             "Conformance (bench/openai_conformance.py, `openai` " + result["openai_version"]
             + "), pass / FAIL per side:", "",
             "| case | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for i, case in enumerate(sides[names[0]]):
        cells = [("pass" if sides[n][i]["is_ok"] else "**FAIL**") for n in names]
        lines.append(f"| {case['name']} | " + " | ".join(cells) + " |")
    lines += ["", "Observed per case (where the sides differ, every side is listed):", ""]
    for i, case in enumerate(sides[names[0]]):
        seen = {n: sides[n][i]["observed"] for n in names}
        if len(set(seen.values())) == 1:
            lines.append(f"- {case['name']}: all sides: {seen[names[0]]}")
        else:
            lines.append(f"- {case['name']}: " + "; ".join(f"**{n}**: {v}"
                                                            for n, v in seen.items()))
    lines += ["", "Added latency of kvfleet's router, ms (router − direct, same backend, same "
              "round), and its CPU per request; median (min–max) over rounds. Percentiles are "
              f"over the {result['requests']} requests of a cell (p99 is their slowest). "
              "Completions are not streamed, so their TTFT is the total. Router CPU: its "
              "process over the cell / requests; 'of which not idle' subtracts what the same "
              "router used during the same round's direct cell (idle: health and /metrics "
              "polling; about as long). Engine CPU: the direct cell's engine process tree.", "",
              "| backend | conc | mode | direct TTFT p50 | added TTFT p50 | added TTFT p99 | "
              "direct total p50 | added total p50 | added total p99 | router CPU µs/req | "
              "of which not idle | engine CPU ms/req | errors |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in result["summary"]:
        is_stream = row["mode"] == "chat-stream"
        ttft = [fmt(row["direct_ttft_p50_ms"]), fmt(row["added_ttft_p50_ms"]),
                fmt(row["added_ttft_p99_ms"])] if is_stream else ["—", "—", "—"]
        lines.append(f"| {row['backend']} | {row['concurrency']} | {row['mode']} | "
                     + " | ".join(ttft) + f" | {fmt(row['direct_p50_ms'])} | "
                     f"{fmt(row['added_p50_ms'])} | {fmt(row['added_p99_ms'])} | "
                     f"{fmt(row['router_cpu_us_per_req'], 0)} | "
                     f"{fmt(row['router_net_cpu_us_per_req'], 0)} | "
                     f"{fmt(row['engine_cpu_ms_per_req'], 0)} | {row['errors']} |")
    return "\n".join(lines) + "\n"


def render_router_vllm_overhead(results: dict[str, Any]) -> str:
    result = results["router_vllm_overhead"]
    return "\n".join([
        code("bash bench/setup_vllm_cpu.sh                              # once",
             ".venv/bin/python bench/router_vllm_overhead.py            # writes "
             "bench/results/router_vllm_overhead.{json,md}",
             ".venv/bin/python bench/router_vllm_overhead.py --quick    # 1 round"),
        "", f"Served as `{result['model']}`; vLLM: `{_command(result['vllm_command'])}`; "
            f"kvfleet: `{_command(result['kvfleet_engine_command'])}`.", "",
        results_markdown(result).rstrip("\n")])


def _command(argv: list[str]) -> str:
    """The argv with the machine's checkout path left out."""
    root = argv[0].split("/bench/")[0].split("/.venv/")[0] + "/"
    return " ".join(a.replace(root, "") for a in argv)
