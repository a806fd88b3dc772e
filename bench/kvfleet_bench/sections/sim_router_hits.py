"""bench/sim_router_hits.py: candidate routing policies on the simulator's model of the live
router bench, over seeds and the live bench's slices."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code, plain, spread, table

FILES = ("sim_router_hits",)


def results_markdown(result: dict[str, Any]) -> str:
    """The run's table, from its result JSON (also what the script writes as .md)."""
    labels = list(result["slices"][0]["rows"])
    rows = []
    for s in result["slices"]:
        cells = [f"{spread(r['hit_fraction'], plain(4))} "
                 f"[{r['backends_per_shared_prefix']:.3f}]"
                 for r in (s["rows"][label] for label in labels)]
        rows.append([f"{s['skip']}, {s['num_backends']}", *cells])
    return "\n".join([
        f"Run: `{result['command']}` on commit {result['commit']}; {result['seeds']} seeds "
        "per cell; hit fraction median (min–max) over the seeds, backends per shared prefix "
        "(median) in brackets. The first slice is the live bench's own; the rest are the "
        "slices its README reports as held out.", "",
        table(["slice (skip, backends)", *(f"`{x}`" for x in labels)], rows)]) + "\n"


def render_sim_router_hits(results: dict[str, Any]) -> str:
    out = [code(".venv/bin/python bench/sim_router_hits.py --pipelines \\",
                "    '{\"space\": {\"scorers\": {\"prefix\": 1, \"queue\": 4, \"space\": "
                "0.01}, \"guard\": true}}'   # writes bench/results/sim_router_hits.{json,md}")]
    if "sim_router_hits" in results:
        out += ["", results_markdown(results["sim_router_hits"]).rstrip("\n")]
    return "\n".join(out)
