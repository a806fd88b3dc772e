"""bench/text_precise_cost.py: what tokenizing text prompts in the router costs and buys."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code, table

FILES = ("text_precise_cost",)


def render_text_precise_cost(results: dict[str, Any]) -> str:
    r = results["text_precise_cost"]
    cpu = r["cpu_per_request"]
    out = [code(".venv/bin/python bench/text_precise_cost.py"), "",
           "Router CPU per request, parse + route + record (µs):", ""]
    out.append(table(["prompt chars", "tokens", "without", "with", "added"],
                     [[f"{x['prompt_chars']:,}", f"{x['tokens']:,}", f"{x['without_us']:,.0f}",
                       f"{x['with_us']:,.0f}", f"+{x['added_us']:,.0f}"] for x in cpu]))
    per_char = sorted(x["added_us_per_kchar"] / 1000 for x in cpu)
    out += ["", f"Added CPU per prompt character: {per_char[0]:.2f}–{per_char[-1]:.2f} µs.", "",
            "Tokenizing inline (the event loop blocked that long) against on the thread "
            "(`encode_batch`, GIL released; the request's added latency and CPU):", ""]
    out.append(table(["prompt chars", "inline: loop blocked (µs)", "thread: latency (µs)",
                      "thread: extra CPU (µs)"],
                     [[f"{x['prompt_chars']:,}", f"{x['inline_blocks_loop_us']:,.0f}",
                       f"{x['thread_latency_us']:,.0f}", f"{x['thread_extra_cpu_us']:+,.0f}"]
                      for x in r["offload"]]))
    out += ["", "Replay (chat conversations sharing system prompts, round-robin over R routers "
            "that share nothing, engines publishing KV events to every router): hit fraction "
            "(engines' own count) and router CPU per request:", ""]
    cells: dict[int, dict[bool, str]] = {}
    for x in r["hit_fraction"]:
        cells.setdefault(x["replicas"], {})[x["tokenizer"]] = \
            f"{x['hit_fraction']:.3f} ({x['router_cpu_us_per_request']:,.0f} µs)"
    out.append(table(["routers", "tokenizer off", "tokenizer on"],
                     [[str(n), c.get(False, "—"), c.get(True, "—")]
                      for n, c in sorted(cells.items())]))
    return "\n".join(out)
