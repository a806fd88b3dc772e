"""bench/engine_server.py: the HTTP server's TTFT / ITL and overhead over the offline engine."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import table

FILES = ("engine_server", "engine_server_tiny")


def _g(x: float) -> str:
    return str(x)


def _one(report: dict[str, Any]) -> str:
    c = report["config"]
    lines = [
        f"**{c['model']}**: `.venv/bin/{c['command'].replace(' --update-readme', '').strip()}`: "
        f"{c['runner']} runner, {c['prompt_tokens']}-token random prompts, "
        f"{c['output_tokens']} output tokens, greedy, EOS ignored; closed loop; "
        f"{c['threads']} torch thread(s); {c['rounds']} alternating rounds pooled; measured "
        f"{c['date']} on {c['machine']}.", ""]
    rows = []
    for level in report["levels"]:
        for mode in ("server", "offline"):
            m = level[mode]
            rows.append([m["concurrency"], mode, m["num_requests"], _g(m["output_tok_per_s"]),
                         f"{_g(m['ttft_p50_ms'])} / {_g(m['ttft_p99_ms'])}",
                         f"{_g(m['itl_p50_ms'])} / {_g(m['itl_p99_ms'])}", m["num_errors"]])
    lines.append(table(["streams", "mode", "req", "out tok/s", "TTFT p50 / p99 ms",
                        "ITL p50 / p99 ms", "errors"], rows))
    lines += ["", "Server overhead = server / offline (1 means none):", ""]
    lines.append(table(["streams", "wall time", "TTFT p50", "ITL p50"],
                       [[lv["server"]["concurrency"], _g(lv["ratio"]["wall"]),
                         _g(lv["ratio"]["ttft_p50"]), _g(lv["ratio"]["itl_p50"])]
                        for lv in report["levels"]]))
    return "\n".join(lines)


def render_engine_server(results: dict[str, Any]) -> str:
    return "\n\n".join(_one(report) for report in results.values())
