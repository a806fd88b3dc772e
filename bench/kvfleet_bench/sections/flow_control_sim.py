"""bench/flow_control_sim.py: issue 28's acceptance figures, in the simulator with the
router's own flow-control code."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code, pct, stat, table
from kvfleet_bench.sections.flow_control import _ms, _x, _yes  # the live section's formats

FILES = ("flow_control_sim",)


def _rows(f: dict[str, Any], t: dict[str, float], num_unexplained: int) -> list[list[str]]:
    """(scenario, target) -> (measured, met) rows of one in-flight cap's figures."""
    rows: list[list[str]] = []
    if iso := f.get("isolation"):
        rows += [
            ["isolation: A's TTFT p90, alone → beside B's flood",
             f"{_ms(iso['a_ttft_p90_alone_ms'])} → {_ms(iso['a_ttft_p90_flood_ms'])}", ""],
            ["isolation: ratio flood / alone",
             f"{_x(iso['a_ttft_p90_ratio'])} {_yes(iso['is_ratio_met'])}",
             f"≤ {t['isolation_ttft_p90_ratio']:g}x"],
            ["isolation: A's requests not served (all seeds)",
             f"{iso['a_lost']} {_yes(iso['is_nothing_lost_for_a'])}", "0"],
            ["isolation: served req/s A / B under the flood; B refused (all seeds)",
             f"{stat(iso['a_served_rps'], lambda x: f'{x:.1f}')} / "
             f"{stat(iso['b_served_rps'], lambda x: f'{x:.1f}')}; {iso['b_refused']}", ""],
        ]
    if fa := f.get("fair"):
        rows += [
            ["fair shares: largest gap, share / weight share − 1, in absolute value",
             f"{stat(fa['max_rel_error'], pct(1))} {_yes(fa['is_share_met'])}",
             f"≤ {100 * t['fair_max_rel_error']:g}%"],
            ["fair shares: Jain's index, the two tenants of weight 1",
             f"{stat(fa['jain_equal_weight'], lambda x: f'{x:.3f}')} {_yes(fa['is_jain_met'])}",
             f"≥ {t['fair_jain_equal_weight']:g}"],
        ]
    if pr := f.get("priority"):
        rows += [
            ["priorities: critical TTFT p99, alone → beside a sheddable flood",
             f"{_ms(pr['crit_ttft_p99_alone_ms'])} → {_ms(pr['crit_ttft_p99_flood_ms'])}", ""],
            ["priorities: ratio flood / alone",
             f"{_x(pr['crit_ttft_p99_ratio'])} {_yes(pr['is_ratio_met'])}",
             f"≤ {t['priority_ttft_p99_ratio']:g}x"],
            ["priorities: critical requests not served (all seeds)",
             f"{pr['crit_lost']} {_yes(pr['crit_lost'] == 0)}", "0"],
            ["priorities: sheddable tokens served / (pool capacity − critical's)",
             stat(pr["shed_of_capacity_left"], pct(0)), ""],
        ]
    rows.append(["every request served, or refused with 429/503 and a reason",
                 f"{num_unexplained} not {_yes(num_unexplained == 0)}", "0 not"])
    return rows


def render_flow_control_sim(results: dict[str, Any]) -> str:
    r = results["flow_control_sim"]
    meta, a = r["meta"], r["meta"]["args"]
    prof, git = meta["engine_profile"], meta["git"]
    caps = [str(c) for c in meta["capacities"]]
    out = [code(".venv/bin/python bench/flow_control_sim.py   # under flock "
                "/tmp/kvfleet-cpu.lock; writes bench/results/flow_control_sim.json",
                f"# = {meta['command'].rstrip()}"), ""]
    out.append(
        f"Pool `{meta['pool']}` in virtual time: one kvfleet engine (the real scheduler and "
        f"KV cache), `max_num_seqs` 4, every step {1000 * prof['overhead_s']:g} ms plus "
        f"{1e6 * prof['prefill_s_per_token']:g} µs per prompt token; router in-flight cap "
        f"per endpoint {' and '.join(caps)} (one column each). Requests of "
        f"{a['prompt_tokens']} prompt and {a['max_tokens']} output tokens, Poisson "
        f"arrivals: A / critical at {a['rate']:g} req/s, the flood at {a['flood_factor']:g}x "
        f"that, each fair-share tenant at {a['fair_rate']:g} req/s; queue TTL "
        f"{a['queue_ttl_s']:g} s (fair shares: 30 s, an unbounded queue); "
        f"{a['warmup_s']:g} s warm-up, {a['measure_s']:g} s measured; {a['seeds']} seeds, "
        f"median (min–max). Commit `{git['commit'][:10]}`"
        f"{' (router/ differed from it)' if git['router_tree_differs'] else ''}, "
        f"{meta['started_utc'][:10]}, {meta['cpu_s']:.0f} s of CPU in all; fairness "
        f"{a['fairness']}.")
    out.append("")
    by_cap = r["by_capacity"]
    per_cap = [_rows(by_cap[c]["figures"], meta["targets"], by_cap[c]["num_unexplained"])
               for c in caps]
    rows = [[first[0], *(rows_[i][1] for rows_ in per_cap), first[2]]
            for i, first in enumerate(per_cap[0])]
    out.append(table(["scenario", *(f"cap {c}: measured, met" for c in caps), "target"], rows))
    fa = by_cap[caps[0]]["figures"].get("fair")
    if fa:
        out.append("")
        out.append(table(["tenant", "weight", "weight share",
                          f"served token share (cap {caps[0]})"],
                         [[name, f"{fa['weight'][name]:g}", pct(1)(fa["weight_share"][name]),
                           stat(s, pct(1))] for name, s in fa["share"].items()]))
    return "\n".join(out)
