"""bench/flow_control.py: issue 28's acceptance figures, measured live."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code, pct, stat, table

FILES = ("flow_control", "flow_control_cap2x")  # the main run; the cap at twice the batch


def _ms(d: dict[str, float]) -> str:
    return stat(d, lambda x: f"{x:,.0f} ms")


def _x(d: dict[str, float]) -> str:
    return stat(d, lambda x: f"{x:.2f}x")


def _yes(ok: bool) -> str:
    return "yes" if ok else "**no**"


def render_flow_control(results: dict[str, Any]) -> str:
    r = results["flow_control"]
    meta, f, a = r["meta"], r["figures"], r["meta"]["args"]
    t = meta["targets"]
    git = meta["git"]
    out = [code(".venv/bin/python bench/flow_control.py   # under flock /tmp/kvfleet-cpu.lock; "
                "writes bench/results/flow_control.json",
                f"# = {meta['command'].rstrip()}"), ""]
    out.append(
        f"Pool: {a['num_engines']} kvfleet engine(s), simulated runner, `max_num_seqs` "
        f"{a['max_num_seqs']}, every step {a['step_ms']:g} ms plus "
        f"{a['prefill_us_per_token']:g} µs per prompt token; router in-flight cap "
        f"{a['capacity']} per endpoint (the rest waits in flow control's queue). Requests: "
        f"streamed completions of {a['prompt_chars']} prompt characters (tokens, byte "
        f"tokenizer) and {a['max_tokens']} output tokens; TTFT is the first body chunk. "
        f"Tenant A / critical at {a['rate']:g} req/s (Poisson), the flood at "
        f"{a['flood_factor']:g}x that; {a['warmup_s']:g} s warm-up, {a['measure_s']:g} s "
        f"measured; {a['reps']} repetitions, median (min–max), the two configurations "
        f"alternating. Commit `{git['commit'][:10]}`"
        f"{' (router/ differed from it)' if git['router_tree_differs'] else ''}, "
        f"{meta['started_utc'][:10]}, {meta['wall_s'] / 60:.0f} min on 2 cores, client "
        f"{'pinned to its own core' if meta['is_pinned'] else 'not pinned'}; fairness "
        f"{a['fairness']}.")
    out.append("")
    rows = []
    if iso := f.get("isolation"):
        rows.append(["isolation: A's TTFT p90, alone → beside B's flood",
                     f"{_ms(iso['a_ttft_p90_alone_ms'])} → {_ms(iso['a_ttft_p90_flood_ms'])}",
                     "", ""])
        rows.append(["isolation: ratio flood / alone", _x(iso["a_ttft_p90_ratio"]),
                     f"≤ {t['isolation_ttft_p90_ratio']:g}x", _yes(iso["is_ratio_met"])])
        rows.append(["isolation: A's requests not served (all runs)", str(iso["a_lost"]), "0",
                     _yes(iso["is_nothing_lost_for_a"])])
        rows.append(["isolation: served req/s A / B under the flood",
                     f"{stat(iso['a_served_rps'], lambda x: f'{x:.1f}')} / "
                     f"{stat(iso['b_served_rps'], lambda x: f'{x:.1f}')}", "", ""])
        rows.append(["isolation: how long a flood request holds its slot after its first "
                     "token (B's median)", _ms(iso["b_decode_p50_ms"]), "", ""])
    if fa := f.get("fair"):
        rows.append(["fair shares: largest gap, share / weight share − 1, in absolute value",
                     stat(fa["max_rel_error"], pct(1)), f"≤ {100 * t['fair_max_rel_error']:g}%",
                     _yes(fa["is_share_met"])])
        rows.append(["fair shares: Jain's index, the two tenants of weight 1",
                     stat(fa["jain_equal_weight"], lambda x: f"{x:.3f}"),
                     f"≥ {t['fair_jain_equal_weight']:g}", _yes(fa["is_jain_met"])])
    if pr := f.get("priority"):
        rows.append(["priorities: critical TTFT p99, alone → beside a sheddable flood",
                     f"{_ms(pr['crit_ttft_p99_alone_ms'])} → {_ms(pr['crit_ttft_p99_flood_ms'])}",
                     "", ""])
        rows.append(["priorities: ratio flood / alone", _x(pr["crit_ttft_p99_ratio"]),
                     f"≤ {t['priority_ttft_p99_ratio']:g}x", _yes(pr["is_ratio_met"])])
        rows.append(["priorities: critical requests not served", str(pr["crit_lost"]), "0",
                     _yes(pr["crit_lost"] == 0)])
        rows.append(["priorities: sheddable tokens served / (pool capacity − critical's)",
                     stat(pr["shed_of_capacity_left"], pct(0)), "", ""])
    if q := f.get("quota"):
        for key, name in (("rpm", "RPM"), ("tpm", "TPM")):
            rows.append([f"quotas: served / {name} limit over {a['quota_window_s']:g} s from "
                         "cold, sending twice the limit",
                         stat(q[key]["served_over_limit"], lambda x: f"{x:.3f}"),
                         f"1 ± {100 * t['quota_rel_error']:g}%", _yes(q[key]["is_limit_met"])])
            rows.append([f"quotas: {name} refusals in OpenAI's shape (429, "
                         "rate_limit_exceeded, Retry-After, x-ratelimit-*)",
                         f"{q[key]['num_429']} refusals", "all",
                         _yes(q[key]["is_openai_shape"])])
        rows.append(["quotas: the openai client raises RateLimitError", "", "yes",
                     _yes(q["openai_client_raises"])])
    if w := f.get("waiting"):
        rows.append(["waiting room: first request at port open (no replica ready: "
                     f"{'yes' if w['is_no_replica_ready_at_send'] else 'no'}) served",
                     f"{w['num_ok']} of {w['num_tries']}", "all",
                     _yes(w["num_ok"] == w["num_tries"])])
        rows.append(["waiting room: its latency; port open after start",
                     f"{stat(w['latency_s'], lambda x: f'{x:.2f} s')}; "
                     f"{stat(w['port_open_after_start_s'], lambda x: f'{x:.2f} s')}", "", ""])
        rows.append(["waiting room: `kvfleet up` printed a URL before the announcement",
                     "yes" if w["is_url_printed_early"] else "no", "no",
                     _yes(not w["is_url_printed_early"])])
    rows.append(["every request served, or refused with 429/503 and a reason",
                 f"{r['num_unexplained']} not", "0 not", _yes(r["num_unexplained"] == 0)])
    out.append(table(["scenario", "measured", "target", "met"], rows))
    if fa:
        out.append("")
        out.append(table(["tenant", "weight", "weight share", "served token share"],
                         [[name, f"{fa['weight'][name]:g}",
                           pct(1)(fa["weight_share"][name]), stat(s, pct(1))]
                          for name, s in fa["share"].items()]))
    if cap2 := results.get("flow_control_cap2x"):
        out += ["", _cap_table(r, cap2)]
    return "\n".join(out)


def _cap_table(main: dict[str, Any], cap2: dict[str, Any]) -> str:
    """Isolation and priorities with the router's in-flight cap at the batch (the main run)
    and at twice the batch (what the operator configures)."""
    a2 = cap2["meta"]["args"]
    lines = [f"The router's in-flight cap per endpoint, {main['meta']['args']['capacity']} (the "
             f"main run) against {a2['capacity']} (twice the batch, as the operator sets it; "
             f"`{cap2['meta']['command'].rstrip()}`, {a2['reps']} repetitions, "
             f"commit `{cap2['meta']['git']['commit'][:10]}`):", ""]
    rows = []
    for run in (main, cap2):
        f, cap = run["figures"], run["meta"]["args"]["capacity"]
        iso, pr = f.get("isolation"), f.get("priority")
        rows.append([
            str(cap),
            f"{_ms(iso['a_ttft_p90_flood_ms'])}, {_x(iso['a_ttft_p90_ratio'])}" if iso else "",
            str(iso["a_lost"]) if iso else "",
            f"{_ms(pr['crit_ttft_p99_flood_ms'])}, {_x(pr['crit_ttft_p99_ratio'])}" if pr else "",
            str(pr["crit_lost"]) if pr else "",
        ])
    lines.append(table(["in-flight cap", "A's TTFT p90 under the flood, ratio to alone",
                        "A not served", "critical TTFT p99 under the flood, ratio to alone",
                        "critical not served"], rows))
    return "\n".join(lines)
