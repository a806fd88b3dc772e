"""bench/router_overhead.py: kvfleet's router vs sglang-router vs vllm-router vs direct."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code

FILES = ("router_overhead", "router_overhead_cache_aware")

# the tables are also those bench/router_overhead.py writes beside its JSON and prints


def fmt(s: dict[str, float], digits: int = 1) -> str:
    if s["median"] != s["median"]:
        return "—"
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def results_markdown(result: dict) -> str:
    """A run's result tables, from its result JSON (also what the script writes as .md)."""
    meta, head, lat = result["meta"], result["headline"], result["latency"]
    levels = meta["levels"]
    paced = [k for k in levels if lat["direct"][k]["is_paced"]]
    targets = list(lat)
    lines = [f"Run: `{meta['command'].strip()}`, started {meta['started_utc']}, "
             f"{meta['reps']} repetitions x {meta['duration_s']:g} s per level "
             f"(+{meta['warmup_s']:g} s unmeasured warm-up each), load side {meta['load']}, "
             f"pinned: {meta['is_pinned']}, load average at start "
             f"{', '.join(f'{x:.1f}' for x in meta['machine']['loadavg'])} on "
             f"{meta['machine']['num_cpus']} cores. Cells: median (min–max) over repetitions.",
             "",
             f"Router CPU per request at {head['level']} (connections:think ms, about "
             f"{lat['direct'][head['level']]['rps']['median']:.0f} req/s offered):", "",
             "| router | CPU µs/req | implied one-core ceiling (req/s) | CPU vs cheapest peer "
             "(per-rep ratio) | achieved req/s | router core use |",
             "|---|---|---|---|---|---|"]
    ratios = head.get("cpu_ratio_to_cheapest_peer", {})
    for t in targets:
        if t == "direct":
            continue
        row = lat[t][head["level"]]
        ratio = ""
        if t in ratios:
            r = ratios[t]
            ratio = f"{r['median']:.2f}x ({r['min']:.2f}–{r['max']:.2f})"
        lines.append(f"| {t} | {fmt(row['router_cpu_us_per_req'], 0)} | "
                     f"{head['implied_one_core_rps'].get(t, float('nan')):.0f} | {ratio} | "
                     f"{fmt(row['rps'], 0)} | {fmt(row['router_util'], 2)} |")
    lines += same_policy_lines("request", head.get("cpu_ratio_same_policy", {}))
    lines += floor_lines("request", head.get("floor_ratios", {}))
    lines += ["", "Added latency at the paced (unsaturated) levels, ms, target minus direct in "
              "the same repetition, p50 / p99:", "",
              "| target | " + " | ".join(paced) + " |", "|---|" + "---|" * len(paced)]
    for t in targets:
        if t == "direct":
            cells = [f"{fmt(lat[t][k]['p50_ms'], 2)} / {fmt(lat[t][k]['p99_ms'], 2)} (absolute)"
                     for k in paced]
        else:
            cells = [f"{fmt(lat[t][k]['added_p50_ms'], 2)} / {fmt(lat[t][k]['added_p99_ms'], 2)}"
                     for k in paced]
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    lines += ["", "Per level: req/s, router CPU µs/req and router core use (medians):", "",
              "| target | " + " | ".join(levels) + " |", "|---|" + "---|" * len(levels)]
    for t in targets:
        cells = []
        for k in levels:
            row = lat[t][k]
            cell = f"{row['rps']['median']:.0f}/s"
            if t != "direct":
                cell += (f", {row['router_cpu_us_per_req']['median']:.0f} µs, "
                         f"{row['router_util']['median']:.2f}")
            if row["num_errors"]:
                cell += f", {row['num_errors']} errors"
            cells.append(cell)
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    if result.get("streamed"):
        lines += ["", streamed_markdown(result)]
    if result.get("workers"):
        lines += ["", workers_markdown(result)]
    streams = result["streams"]
    if streams:
        lines += ["", f"{meta['streams']} concurrent streams ({meta['stream_tokens']} tokens, "
                  f"{meta['stream_token_delay_ms']:g} ms apart), one run each:", "",
                  "| target | ok | errors | peak open | router peak RSS (MB) | "
                  "stream p50 / p99 (s) | router CPU (s) | listen drops |",
                  "|---|---|---|---|---|---|---|---|"]
        for t, st in streams.items():
            rss = f"{st['peak_rss_mb']:.0f}" if t != "direct" else "—"
            lines.append(f"| {t} | {st['num_ok']} | {st['num_errors']} | {st['peak_open']} | "
                         f"{rss} | {st['latency_p50_ms'] / 1000:.1f} / "
                         f"{st['latency_p99_ms'] / 1000:.1f} | {st['router_cpu_s']:.1f} | "
                         f"{st['listen_drops']} |")
    return "\n".join(lines)


def streamed_markdown(result: dict) -> str:
    """The streamed level: router CPU per streamed answer against the peers'."""
    st = result["streamed"]
    lines = [f"Streamed level {st['level']} (connections:think ms): answers of "
             f"{st['answer_tokens']} tokens, {st['token_delay_ms']:g} ms apart from the "
             "backends; router CPU per stream (and per token) and added stream latency (p50, "
             "target minus direct, same repetition):", "",
             "| target | CPU µs/stream | CPU µs/token | streams/s | stream p50 (ms) | "
             "added p50 (ms) | router core use | errors |",
             "|---|---|---|---|---|---|---|---|"]
    for t, row in st["per_target"].items():
        if t == "direct":
            lines.append(f"| {t} | — | — | {fmt(row['streams_per_s'], 0)} | "
                         f"{fmt(row['p50_ms'], 1)} | — | — | {row['num_errors']} |")
            continue
        added = fmt(row["added_p50_ms"], 2) if "added_p50_ms" in row else "—"
        lines.append(f"| {t} | {fmt(row['router_cpu_us_per_stream'], 0)} | "
                     f"{fmt(row['router_cpu_us_per_token'], 1)} | "
                     f"{fmt(row['streams_per_s'], 0)} | {fmt(row['p50_ms'], 1)} | {added} | "
                     f"{fmt(row['router_util'], 2)} | {row['num_errors']} |")
    lines += same_policy_lines("stream", st.get("cpu_ratio_same_policy", {}))
    lines += floor_lines("stream", st.get("floor_ratios", {}))
    return "\n".join(lines)


def same_policy_lines(per: str, same: dict) -> list[str]:
    """kvfleet's CPU per `per` over each peer's with the same policy, or nothing."""
    if not same:
        return []
    return ["", f"Same policy, CPU per {per} ratio (per repetition, median (min–max)): "
            + "; ".join(f"{k} {v['median']:.2f}x ({v['min']:.2f}–{v['max']:.2f})"
                        for k, v in same.items()) + "."]


def floor_lines(per: str, ratios: dict) -> list[str]:
    """The bare aiohttp proxy (aiohttp-floor) against the peers, and kvfleet against it."""
    if not ratios:
        return []
    return ["", f"Against the floor (aiohttp's server and kvfleet's upstream client, nothing "
            f"else), CPU per {per} ratio (per repetition): "
            + "; ".join(f"{k} {v['median']:.2f}x ({v['min']:.2f}–{v['max']:.2f})"
                        for k, v in ratios.items()) + "."]


def workers_markdown(result: dict) -> str:
    """`--workers N` against one worker at the saturating closed loop, same cores."""
    w = result["workers"]
    lines = [f"Workers, closed loop {w['level']}: {w['note']}.", "",
             "| target | req/s | req/s vs one worker (per-rep ratio) | p50 (ms) | "
             "router CPU µs/req | router core use | errors |",
             "|---|---|---|---|---|---|---|"]
    ratios = w.get("rps_ratio_to_one_worker", {})
    for t, row in w["per_target"].items():
        r = ratios.get(t)
        ratio = f"{r['median']:.2f}x ({r['min']:.2f}–{r['max']:.2f})" if r else "—"
        lines.append(f"| {t} | {fmt(row['rps'], 0)} | {ratio} | {fmt(row['p50_ms'], 2)} | "
                     f"{fmt(row['router_cpu_us_per_req'], 0)} | {fmt(row['router_util'], 2)} | "
                     f"{row['num_errors']} |")
    return "\n".join(lines)


def render_router_overhead(results: dict[str, Any]) -> str:
    out = [code("bash bench/setup_peers.sh                      # once: bench/.venv-peers",
                ".venv/bin/python bench/router_overhead.py      # writes "
                "bench/results/router_overhead.{json,md,png}",
                ".venv/bin/python bench/router_overhead.py --targets "
                "direct,kvfleet:cache-aware,sglang:cache_aware,vllm:cache_aware "
                "--out bench/results/router_overhead_cache_aware.json",
                ".venv/bin/python bench/router_overhead.py --quick --no-pin   "
                "# seconds; what tests/bench runs")]
    for stem, result in results.items():
        out += ["", f"**`bench/results/{stem}.json`** (machine: "
                    f"{result['meta']['machine']['cpu'] or 'not recorded'}):", "",
                results_markdown(result)]
    return "\n".join(out)
