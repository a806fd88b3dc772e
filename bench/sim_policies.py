"""Routing policies, autoscalers and scaling efficiency in the simulator; writes
bench/sim_policies.md.

    .venv/bin/python bench/sim_policies.py --jobs 2   # hours on 2 free cores; deterministic
                                                      # (each Mooncake autoscaler section,
                                                      # with its optimum, about an hour)
    .venv/bin/python bench/sim_policies.py --quick    # shorter slices, N <= 16, for a look
    .venv/bin/python bench/sim_policies.py --only 'Routing policies'   # those sections only,
                                                      # put into the existing report in place

Every table is one `kvfleet sim compare` or `kvfleet sim efficiency` (sim/kvfleet_sim)
over the same trace slice and seed: the real engine scheduler and prefix-cached KV per
replica with the h100-llama3-8b cost model, the router's RouterCore (prefix indexes fed as
in production) and the operator's control loop. Summaries (no per-second series) also go to
bench/results/sim_policies.json, the scaling-efficiency plot to
bench/results/sim_efficiency.png.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from kvfleet_bench.readme import refresh_section

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
RESULTS = ROOT / "bench" / "results"
UNIFIED = "sim/pools/h100-llama3-8b-16.yaml"
PD = "sim/pools/h100-llama3-8b-pd.yaml"
UNIFIED_32 = "sim/pools/h100-llama3-8b-32.yaml"  # Mooncake needs more than 16 at its peaks
PD_32 = "sim/pools/h100-llama3-8b-pd-32.yaml"
SIZES_16 = "the unified pool (2-16 replicas) and the P/D pool (1-6 prefill, 2-10 decode)"
SIZES_32 = "the unified pool (2-32 replicas) and the P/D pool (1-12 prefill, 2-20 decode)"
TUNING = ROOT / "sim" / "pools" / "tuning"
# cache-aware weight variants the default (prefix 1 / queue 4 / kv 0) was chosen among
WEIGHTS = {"p1-q1-kv0.5": (1.0, 1.0, 0.5), "p1-q2-kv0": (1.0, 2.0, 0.0),
           "p1-q4-kv0.5": (1.0, 4.0, 0.5), "p1-q8-kv0": (1.0, 8.0, 0.0),
           "p2-q4-kv0": (2.0, 4.0, 0.0)}  # fmt: skip
ROUTING = ["cache-aware", "sgl-cache-aware", "prefix-cache", "least-request", "least-kv",
           "round-robin", "random", "session", "latency", "ucb", "slo", "backlog"]  # fmt: skip


EFFICIENCY_PLOT = RESULTS / "sim_efficiency.png"
# replica start-up times the autoscaler sections sweep (Dynamo documents an SLO cliff at
# 100-120 s; 10 s is a warm node with the image cached)
STARTUPS_S = (10, 120)


def variant_pool(stem: str, what: str, edit: Callable[[dict], None],
                 base: str = UNIFIED) -> Path:
    """sim/pools/tuning/<base>-<stem>.yaml: the pool `base` (the 16-replica one unless
    said) with `edit` applied to its manifest (written once; the files are committed)."""
    import yaml

    name = Path(base).stem
    path = TUNING / f"{name}-{stem}.yaml"
    pool = yaml.safe_load((ROOT / base).read_text())
    pool["metadata"]["name"] = f"{name}-{stem.replace('.', '')}"
    edit(pool)
    text = (f"# bench/sim_policies.py writes this: {Path(base).name} with {what}.\n"
            + yaml.safe_dump(pool, sort_keys=False))  # fmt: skip
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return path


def weight_pool(name: str) -> Path:
    """The 16-replica pool with one cache-aware weight variant."""
    prefix, queue, kv = WEIGHTS[name]
    return variant_pool(name, f"cache-aware weights prefix {prefix:g} / queue {queue:g} / kv "
                              f"{kv:g}", lambda pool: pool["spec"]["routing"].__setitem__(
                                  "weights", {"prefix": prefix, "queue": queue, "kv": kv}))


def match_pool(least: float) -> Path:
    """The 16-replica pool with routing.minPrefixMatch at `least` (the default 0.1 was
    chosen against 0, the rule before it)."""
    return variant_pool(f"match{least:g}", f"routing.minPrefixMatch {least:g}",
                        lambda pool: pool["spec"]["routing"].__setitem__("minPrefixMatch",
                                                                         least))


# The pending scorer (requests not yet answered with a first byte) beside each preset's own
# load term, at four times its weight, chosen before any run: one request waiting for its
# prefill outweighs one more streaming its answer (router/README.md, `pending`). The slo
# preset has it since these sections; its row without it is the last here.
PENDING = {
    "pending-cache-aware": ("cache-aware weights prefix 1 / queue 4 / kv 0 / pending 16",
                            {"policy": "cache-aware",
                             "weights": {"prefix": 1.0, "queue": 4.0, "kv": 0.0,
                                         "pending": 16.0}}),
    "pending-least-request": ("least-request's queue scorer plus pending at 4x its weight",
                              {"policy": "pipeline",
                               "pipeline": {"scorers": {"queue": 1.0, "pending": 4.0}}}),
    "previous-slo": ("the slo preset before pending (inside bounded-load, slo 1 / queue 1)",
                     {"policy": "pipeline",
                      "pipeline": {"filters": ["bounded-load"],
                                   "scorers": {"slo": 1.0, "queue": 1.0}}}),
}


def pending_pool(stem: str, base: str) -> str:
    """`base` with the routing of PENDING[stem], its path from the repository root."""
    what, spec = PENDING[stem]
    return str(variant_pool(stem, what, lambda pool: pool["spec"].__setitem__(
        "routing", {**pool["spec"]["routing"], **spec}), base).relative_to(ROOT))


def pending_pools(base: str) -> list[str]:
    """`--pool` arguments: `base` as shipped, then `base` with each PENDING routing."""
    paths = [base] + [pending_pool(stem, base) for stem in PENDING]
    return sum((["--pool", p] for p in paths), [])


def ceiling_note(trace: str, start_s: float, duration_s: float) -> str:
    """One sentence: the share of the measured requests any fleet could serve within the
    TTFT SLO (`kvfleet_sim.ceiling`), for traces with prompts too long for it."""
    from kvfleet_engine.runners.cost_model import load_profile
    from kvfleet_sim.ceiling import attainment_ceiling
    from kvfleet_sim.trace import load_trace

    reqs = load_trace(trace, start_s, duration_s, 1.0)
    ceiling = attainment_ceiling(reqs, load_profile("h100-llama3-8b"), 8192, 2.0)
    return (f" Ceiling: {1 - ceiling:.1%} of these {len(reqs):,} prompts take longer than the "
            "2 s TTFT SLO to prefill alone on an idle replica with an empty cache (the cost "
            "model, 8,192-token chunks): without prefix hits no fleet meets the SLO for more "
            f"than {ceiling:.1%} (a hit shortens the prefill and can lift that).")  # fmt: skip


PER_SECOND = ("timeline", "role_timeline", "imbalance")  # each command's own --json has them


def compact(runs: list[dict]) -> list[dict]:
    """The sections' results without their per-second series (tens of MB over 30-minute
    replays): summaries, variants, scale reasons and efficiency probes stay."""
    out = []
    for section in runs:
        result = dict(section["result"])
        if "runs" in result:
            result["runs"] = [{k: v for k, v in r.items() if k not in PER_SECOND}
                              for r in result["runs"]]  # fmt: skip
        out.append({**section, "result": result})
    return out


def run_section(section: tuple[str, str, str, list[str]], index: int,
                commit: str) -> tuple[list[str], dict]:
    """One `kvfleet sim` command, its table captured: (markdown lines naming the commit it
    ran on, its JSON)."""
    from kvfleet_sim.cli import main as sim_main

    title, what, command, sim_args = section
    path = RESULTS / f"sim_policies_{index}.json"
    started = time.perf_counter()
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = sim_main([command, *sim_args, "--no-progress", "--json", str(path)])
    if rc != 0:
        raise SystemExit(f"sim_policies: section {title!r} exited {rc}")
    table = buf.getvalue().strip().splitlines()
    cmd = f"kvfleet sim {command} " + " ".join(
        a.replace(str(TRACES), "../shared/traces").replace(str(ROOT) + "/", "")
        for a in sim_args)  # fmt: skip
    lines = [f"## {title}", "", what, "", f"Ran on commit {commit}:", "", "```", cmd, "```", "",
             *table[:-1], ""]
    if command == "efficiency":
        plot = os.path.relpath(EFFICIENCY_PLOT, RESULTS.parent)
        lines += [f"![scaling efficiency]({plot})", ""]
    result = {"title": title, "args": sim_args, "result": json.loads(path.read_text())}
    path.unlink()
    print(f"{title}: {time.perf_counter() - started:.0f} s wall", file=sys.stderr, flush=True)
    return lines, result


AZURE_RATE = "8"  # 4 replicas at 8x the trace's rate: loaded, so routing decides
# every other replica at half speed: the pool of two speeds the slo policy is shown on
TWO_SPEEDS = ["--replica-profile", "h100-llama3-8b",
              "--replica-profile", "sim/pools/profiles/h100-llama3-8b-half-speed.json"]
# Routing verdicts are read over router seeds (tie-breaks, the weighted pickers' draws):
# on the Mooncake slice one policy's SLO attainment spans most of a point over five seeds
# (the tuning table's match0 row), more than the gaps between most policies there, so one
# seed ranked them by chance.
SEEDS = "5"
SEEDS_NOTE = (" Each row is the median over five router seeds (0-4) per column; SLO met, "
              "prefix hit, imbalance mean and max share give their min-max in brackets.")


def seeds(quick: bool) -> list[str]:
    return [] if quick else ["--seeds", SEEDS]


def two_speeds_args(pools: list[str], quick: bool, extra: tuple[str, ...] = ()) -> list[str]:
    """`kvfleet sim compare` arguments for `pools` (`--pool` arguments) fixed at their
    maximum on the Azure conversation training slice at AZURE_RATE, every other replica at
    half speed (TWO_SPEEDS), then `extra`."""
    return ["--trace", str(TRACES / "azure_llm_2023_conv.csv"), "--start-s", "900",
            "--warmup-s", "120", "--duration-s", "120" if quick else "300", "--compress", "1",
            "--rate", AZURE_RATE, *pools, "--scaler", "fixed-max", *TWO_SPEEDS, *extra,
            *seeds(quick)]  # fmt: skip


def azure_code_slice(start: str, quick: bool, startup_s: int = 10) -> list[str]:
    """The Azure code slice of the autoscaler sections from `start` (5 minutes of warm-up,
    10 measured, 5 when quick), with a `startup_s` start-up."""
    return ["--trace", str(TRACES / "azure_llm_2023_code.csv"), "--start-s", start,
            "--warmup-s", "300", "--duration-s", "300" if quick else "600", "--compress", "1",
            "--startup-s", str(startup_s)]  # fmt: skip


def azure_routing(quick: bool) -> list[tuple[str, str, str, list[str]]]:
    """Every policy on two Azure conversation slices (the first tuned on, the second
    held out), and the latency-learning policies on a pool of two speeds."""
    conv = str(TRACES / "azure_llm_2023_conv.csv")
    dur = "120" if quick else "300"
    out = []
    for start, which in (("900", "training"), ("2400", "held-out")):
        out.append((
            f"Routing policies on the Azure conversation trace ({which} slice, 4 replicas, "
            f"{AZURE_RATE}x rate)",
            f"Every policy on `sim/pools/fidelity-4.yaml` (4 replicas fixed), the trace at "
            f"{AZURE_RATE}x its rate so the replicas queue; the {which} slice."
            + SEEDS_NOTE * (not quick), "compare",
            ["--trace", conv, "--start-s", start, "--warmup-s", "120", "--duration-s", dur,
             "--compress", "1", "--rate", AZURE_RATE, "--pool", "sim/pools/fidelity-4.yaml",
             "--scaler", "fixed-max", *sum((["--policy", p] for p in ROUTING), []),
             *seeds(quick)],
        ))  # fmt: skip
    out.append((
        "Predictive SLO routing on a pool of two speeds (Azure conversation)",
        "The 4-replica pool with every other replica at half speed "
        "(`--replica-profile h100-llama3-8b --replica-profile "
        "sim/pools/profiles/h100-llama3-8b-half-speed.json`); the perf model learns each "
        "replica's own coefficients. `perf MAPE`: the router's predictions of TTFT and TPOT "
        "against what each measured request got." + SEEDS_NOTE * (not quick), "compare",
        two_speeds_args(["--pool", "sim/pools/fidelity-4.yaml"], quick, tuple(sum(
            (["--policy", p] for p in ("slo", "least-request", "cache-aware", "latency", "ucb",
                                       "round-robin", "backlog")), []))),
    ))  # fmt: skip
    return out


def mooncake_sections(title: str, what: str, pools: list[str],
                      quick: bool) -> list[tuple[str, str, str, list[str]]]:
    """`title` (its {which} filled in) on the Mooncake training and held-out slices of the
    routing sections, `pools` (`--pool` arguments) fixed at their maximum."""
    dur = "120" if quick else "300"
    return [(
        title.format(which=which), what + SEEDS_NOTE * (not quick), "compare",
        ["--trace", str(TRACES / "mooncake_conversation.jsonl"), "--start-s", start,
         "--warmup-s", "300", "--duration-s", dur, "--compress", "1", *pools, "--scaler",
         "fixed-max", *seeds(quick)],
    ) for start, which in (("900", "training"), ("2100", "held-out"))]  # fmt: skip


def pending_sections(quick: bool) -> list[tuple[str, str, str, list[str]]]:
    """The pending scorer beside the presets' load terms (PENDING) on the routing sections'
    slices, training and held out, and on the pool of two speeds; each shipped pool first."""
    conv = str(TRACES / "azure_llm_2023_conv.csv")
    dur = "120" if quick else "300"
    what = ("The pool as shipped (`cache-aware`) first, then the same pool with the routing "
            "in each file's name (`sim/pools/tuning/`): `cache-aware` with the pending "
            "scorer at 16 beside queue 4, `least-request` as a pipeline of queue 1 and "
            "pending 4, the `slo` preset as it was before it had pending 4 (slo 1 / queue 1 "
            "inside bounded-load). The presets' own rows, `slo` with pending, are in the "
            "sections above (same slice, same seeds).")
    out = mooncake_sections("A pending-prefill load term on the Mooncake {which} slice (16 "
                            "replicas)", what, pending_pools(UNIFIED), quick)
    azure = ["--warmup-s", "120", "--duration-s", dur, "--compress", "1", "--rate", AZURE_RATE,
             *pending_pools("sim/pools/fidelity-4.yaml"), "--scaler", "fixed-max"]
    for start, which in (("900", "training"), ("2400", "held-out")):
        out.append((
            f"A pending-prefill load term on the Azure conversation {which} slice (4 "
            f"replicas, {AZURE_RATE}x rate)", what + SEEDS_NOTE * (not quick), "compare",
            ["--trace", conv, "--start-s", start, *azure, *seeds(quick)],
        ))  # fmt: skip
    out.append((
        "A pending-prefill load term on the pool of two speeds (Azure conversation)",
        what + " Every other replica at half speed, as in the two-speed section above."
        + SEEDS_NOTE * (not quick), "compare",
        two_speeds_args(pending_pools("sim/pools/fidelity-4.yaml"), quick),
    ))  # fmt: skip
    # Under the autoscaler: why the term is not in the default's weights (it lost here).
    out.append((
        "A pending-prefill load term under the autoscaler (Azure code, unified pool, "
        "start-up 10 s)",
        "kvfleet's autoscaler on the unified pool (2-16 replicas) as in the Azure code "
        "autoscaler section, its routing as shipped, then with the pending scorer at 16 "
        "beside queue 4. The misses on this slice are mostly slow tokens (TTFT p99 is a "
        "fraction of its target): a prompt sent where fewer prefills wait lands among more "
        "decodes." + SEEDS_NOTE * (not quick), "compare",
        [*azure_code_slice("900", quick), "--pool", UNIFIED, "--pool",
         pending_pool("pending-cache-aware", UNIFIED), "--scaler", "kvfleet", *seeds(quick)],
    ))  # fmt: skip
    return out


# The `latency` scorer (the request's predicted TTFT and decode on each endpoint) added to
# the default's weights, at the weight of one prefix hit and at the queue's, chosen before
# any run: the `latency` preset alone had the best median on the Mooncake training slice.
LATENCY_IN_DEFAULT = {f"latency{w:g}-cache-aware": {"prefix": 1.0, "queue": 4.0, "kv": 0.0,
                                                      "latency": w} for w in (1.0, 4.0)}


def weights_pools(base: str, variants: dict[str, dict[str, float]]) -> list[str]:
    """`--pool` arguments: `base` as shipped, then `base` with each variant's cache-aware
    weights (sim/pools/tuning/<base>-<stem>.yaml)."""
    paths = [base]
    for stem, weights in variants.items():
        what = "cache-aware weights " + " / ".join(f"{k} {v:g}" for k, v in weights.items())
        paths.append(str(variant_pool(
            stem, what, lambda pool, weights=weights: pool["spec"]["routing"].__setitem__(
                "weights", weights), base).relative_to(ROOT)))
    return sum((["--pool", p] for p in paths), [])


def latency_in_default_sections(quick: bool) -> list[tuple[str, str, str, list[str]]]:
    """The latency scorer inside the default's weights, on the two training slices where
    another policy beat the default (Mooncake, the pool of two speeds)."""
    dur = "120" if quick else "300"
    what = ("The pool as shipped (`cache-aware`, prefix 1 / queue 4 behind the imbalance "
            "guard) first, then the same pool with the `latency` scorer added to its "
            "weights at 1 and at 4 (`sim/pools/tuning/`).")
    return [(
        "The latency scorer inside the default on the Mooncake training slice (16 replicas)",
        what + SEEDS_NOTE * (not quick), "compare",
        ["--trace", str(TRACES / "mooncake_conversation.jsonl"), "--start-s", "900",
         "--warmup-s", "300", "--duration-s", dur, "--compress", "1",
         *weights_pools(UNIFIED, LATENCY_IN_DEFAULT), "--scaler", "fixed-max", *seeds(quick)],
    ), (
        "The latency scorer inside the default on the pool of two speeds (Azure "
        "conversation)",
        what + " Every other replica at half speed, as in the two-speed section above."
        + SEEDS_NOTE * (not quick), "compare",
        two_speeds_args(weights_pools("sim/pools/fidelity-4.yaml", LATENCY_IN_DEFAULT), quick),
    )]  # fmt: skip


# A heavier queue term beside the prefill backlog in the default's weights: queue weights
# 64 and 100 (one request in flight is then worth a quarter and 0.39 of a full prefix hit
# at capacity 256, where at 4 it is worth 1/64), backlog 2. Tuned after the other
# sections, on the Mooncake training slice, the Azure code autoscaler slice and the pool of
# two speeds (queue 4 to 100, backlog 1 to 4); the held-out rows (Mooncake 2,100 s, Azure
# code 2,400 s) were run after the two were chosen. Live they spread shared prefixes
# (bench/results/router_cache_hits_load_weights.md), which is why neither is the default.
LOAD_WEIGHTS = {f"p1-q{q}-backlog2": {"prefix": 1.0, "queue": float(q), "kv": 0.0,
                                       "backlog": 2.0} for q in (64, 100)}


def load_weight_sections(quick: bool) -> list[tuple[str, str, str, list[str]]]:
    """LOAD_WEIGHTS on the Mooncake slices (fixed pool) and under the autoscaler on the
    Azure code slices (unified pool, start-up 10 s), training and held out, and on the pool
    of two speeds (a training slice)."""
    what = ("The pool as shipped (`cache-aware`, prefix 1 / queue 4) first, then the same "
            "pool with the queue weight at 64 and at 100 and the backlog scorer at 2 "
            "(`sim/pools/tuning/`). Both were chosen on the training slices (Mooncake from "
            "900 s, Azure code from 900 s, the pool of two speeds) among queue 4 to 100 and "
            "backlog 1 to 4; the held-out slices were run after. Live, where the backends "
            "do not contend, both spread shared prefixes over more backends and find fewer "
            "hits than the default (`bench/results/router_cache_hits_load_weights.md`).")
    out = mooncake_sections("A heavier load term in the default's weights on the Mooncake "
                            "{which} slice (16 replicas)", what,
                            weights_pools(UNIFIED, LOAD_WEIGHTS), quick)
    for start, which in (("900", "training"), ("2400", "held-out")):
        out.append((
            f"A heavier load term in the default's weights under the autoscaler (Azure code "
            f"{which} slice, unified pool, start-up 10 s)", what + SEEDS_NOTE * (not quick),
            "compare",
            [*azure_code_slice(start, quick), *weights_pools(UNIFIED, LOAD_WEIGHTS),
             "--scaler", "kvfleet", *seeds(quick)],
        ))  # fmt: skip
    out.append((  # a training slice too: the choice was made on it
        "A heavier load term in the default's weights on the pool of two speeds (Azure "
        "conversation)",
        what + " Every other replica at half speed, as in the two-speed section above."
        + SEEDS_NOTE * (not quick), "compare",
        two_speeds_args(weights_pools("sim/pools/fidelity-4.yaml", LOAD_WEIGHTS), quick),
    ))  # fmt: skip
    return out


# The space scorer (fewest prompt blocks in the prefix index) as a tie-break in the
# default's weights: at 0.01 it is below one request's queue score (4 / 256), so it only
# decides where a prompt no endpoint holds goes among equally loaded endpoints. Chosen on
# the live bench's model (bench/sim_router_hits.py), where it narrows the spread over seeds;
# these sections ask whether it costs the SLO where prefills contend.
SPACE_IN_DEFAULT = {"p1-q4-space001": {"prefix": 1.0, "queue": 4.0, "kv": 0.0, "space": 0.01}}


def space_in_default_sections(quick: bool) -> list[tuple[str, str, str, list[str]]]:
    what = ("The pool as shipped (`cache-aware`, prefix 1 / queue 4) first, then the same "
            "pool with the `space` scorer at 0.01 in its weights (`sim/pools/tuning/`), a "
            "tie-break by the fewest prompt blocks recorded per replica (router/README.md).")
    return mooncake_sections("A cache-space tie-break in the default's weights on the "
                             "Mooncake {which} slice (16 replicas)", what,
                             weights_pools(UNIFIED, SPACE_IN_DEFAULT), quick)


# The prefill legs of a P/D pool scored like every other leg (cache-aware's `weights`,
# prefix 1 / queue 4), as before `policy.prefill_weights` (prefix 1 / queue 4 / backlog 4,
# the `backlog` preset's weights, not tuned here): a pipeline of the same weights behind
# the guard, which runs on every leg.
PREVIOUS_PREFILL = {"policy": "pipeline",
                    "pipeline": {"scorers": {"prefix": 1.0, "queue": 4.0, "kv": 0.0},
                                 "guard": True}}


def prefill_weights_sections(quick: bool) -> list[tuple[str, str, str, list[str]]]:
    """The P/D pools as shipped against the same pools with the prefill legs scored by the
    default's weights: Mooncake (the rows that motivated it, and a held-out slice) and
    Azure code (held out), under the autoscaler, start-up 10 s."""
    def pools(base: str) -> list[str]:
        previous = variant_pool("previous-prefill", "the prefill legs scored by the "
                                "default's weights (prefix 1 / queue 4), as before "
                                "policy.prefill_weights", lambda pool: pool["spec"].__setitem__(
                                    "routing", {**pool["spec"]["routing"], **PREVIOUS_PREFILL}),
                                base)
        return ["--pool", base, "--pool", str(previous.relative_to(ROOT))]

    what = ("The P/D pool as shipped first, its prefill legs scored by "
            "`policy.prefill_weights` (prefix 1 / queue 4 / backlog 4: the prompt tokens "
            "queued ahead on a prefill-only replica), then the same pool with every leg "
            "scored by the default's weights (prefix 1 / queue 4), as before "
            "(`sim/pools/tuning/`). Chosen on the Mooncake 900 s P/D rows of the autoscaler "
            "sections (router seed 0); the other slices were set aside before it was run.")
    dur = "300" if quick else "600"
    out = [(
        f"Prefill legs' weights under the autoscaler (Mooncake {which} slice, P/D pool of "
        f"32, start-up 10 s)", what + SEEDS_NOTE * (not quick), "compare",
        ["--trace", str(TRACES / "mooncake_conversation.jsonl"), "--start-s", start,
         "--warmup-s", "300", "--duration-s", dur, "--compress", "1", "--startup-s", "10",
         *pools(PD_32), "--scaler", "kvfleet", *seeds(quick)],
    ) for start, which in (("900", "training"), ("2100", "held-out"))]
    out += [(
        f"Prefill legs' weights under the autoscaler (Azure code from {which}, P/D pool, "
        f"start-up 10 s)", what + SEEDS_NOTE * (not quick), "compare",
        [*azure_code_slice(start, quick), *pools(PD), "--scaler", "kvfleet", *seeds(quick)],
    ) for start, which in (("900", "900 s"), ("2400", "2,400 s"))]  # fmt: skip
    return out


def sections(quick: bool) -> list[tuple[str, str, str, list[str]]]:
    """(title, what it shows, `kvfleet sim` command, its arguments)."""
    moon = str(TRACES / "mooncake_conversation.jsonl")
    dur = "120" if quick else "300"
    m_slice = ["--trace", moon, "--start-s", "900", "--warmup-s", "300", "--duration-s", dur,
               "--compress", "1"]  # fmt: skip
    out = [(
        "Routing policies on the Mooncake conversation trace (16 replicas, approximate index)",
        "Every registered router policy plus sgl-router's cache-aware rule, fixed at 16 "
        "replicas so only routing differs; the router's index is the approximate one the "
        "operator configures." + ceiling_note(moon, 900, float(dur))
        + SEEDS_NOTE * (not quick), "compare",
        [*m_slice, "--pool", UNIFIED, "--scaler", "fixed-max",
         *sum((["--policy", p] for p in ROUTING), []), *seeds(quick)],
    ), (
        "Routing policies on a held-out Mooncake slice (16 replicas, approximate index)",
        "The same policies on trace time no default was tuned on (the slice above is the "
        "one the defaults were chosen on): 20 minutes later in the trace."
        + SEEDS_NOTE * (not quick), "compare",
        ["--trace", moon, "--start-s", "2100", "--warmup-s", "300", "--duration-s", dur,
         "--compress", "1", "--pool", UNIFIED, "--scaler", "fixed-max",
         *sum((["--policy", p] for p in ROUTING), []), *seeds(quick)],
    ), *azure_routing(quick), (
        "Cache-aware routing with the precise index (KV events)",
        "The same slice with every endpoint in `precise` mode (the router's index fed from "
        "the engines' BlockStored/BlockRemoved events)." + SEEDS_NOTE * (not quick),
        "compare",
        [*m_slice, "--pool", UNIFIED, "--scaler", "fixed-max", "--prefix-mode", "precise",
         "--policy", "cache-aware", "--policy", "sgl-cache-aware", "--policy", "round-robin",
         "--policy", "least-request", *seeds(quick)],
    ), (
        "Tuning the default weights (cache-aware, approximate index)",
        "The same slice, 16 replicas, the pool's own `cache-aware` policy with the weights "
        "in each pool file's name (`sim/pools/tuning/`, the 16-replica pool otherwise); the "
        "first row is the shipped default, prefix 1 / queue 4 / kv 0 with a prefix match "
        "under a tenth of the prompt counted as none (`routing.minPrefixMatch` 0.1), the "
        "second the default weights before these, the last the default with every match "
        "counted (`minPrefixMatch` 0, the rule before it)." + SEEDS_NOTE * (not quick),
        "compare",
        [*m_slice, "--pool", UNIFIED, *sum((["--pool", str(weight_pool(name).relative_to(
            ROOT))] for name in WEIGHTS), []), "--pool", str(match_pool(0.0).relative_to(ROOT)),
         "--scaler", "fixed-max", *seeds(quick)],
    ), *pending_sections(quick), *latency_in_default_sections(quick),
        *load_weight_sections(quick), *space_in_default_sections(quick),
        *prefill_weights_sections(quick)]
    # 10 measured minutes (5 when quick) after 5 of warm-up: the oracle replays each minute
    # two to three times per role, so 30-minute slices took most of an hour per trace here
    a_dur = "300" if quick else "600"
    scalers = ["--scaler", "kvfleet", "--scaler", "fixed-max", "--scaler", "waiting-5",
               "--scaler", "kpa", "--scaler", "dynamo-planner", "--scaler", "llmd-keda"]
    about = ("kvfleet's autoscaler, fixed at max, the KEDA rule (waiting > 5 per replica), "
             "a Knative-KPA-style baseline (concurrency over the pool's stable and panic "
             "windows, target 0.7 x maxNumSeqs), a Dynamo-style throughput planner and "
             "llm-d's token-aware KEDA formula (sim/kvfleet_sim/scalers.py), each on {sizes}, "
             "with the hindsight optimum's replica-seconds as the x optimum column "
             "(sim/kvfleet_sim/oracle.py); a new replica is ready {startup_s} s after it is "
             "asked for; the trace at its own pace ({minutes} minutes measured after 5 of "
             "warm-up); replica-seconds per role are in the JSON.")
    for name, trace, unified, pd, sizes in (
        ("Azure conversation", "azure_llm_2023_conv.csv", UNIFIED, PD, SIZES_16),
        ("Azure code", "azure_llm_2023_code.csv", UNIFIED, PD, SIZES_16),
        ("Mooncake conversation", "mooncake_conversation.jsonl", UNIFIED_32, PD_32, SIZES_32),
    ):
        for startup_s in STARTUPS_S:
            out.append((
                f"Autoscalers on {name}, unified and prefill/decode pools, start-up "
                f"{startup_s} s",
                about.format(sizes=sizes, startup_s=startup_s, minutes=int(a_dur) // 60) + (
                    ceiling_note(str(TRACES / trace), 900, float(a_dur))
                    if trace.startswith("mooncake") else ""), "compare",
                ["--trace", str(TRACES / trace), "--start-s", "900", "--warmup-s", "300",
                 "--duration-s", a_dur, "--compress", "1", "--startup-s", str(startup_s),
                 "--pool", unified, "--pool", pd, *scalers, "--optimum"],
            ))  # fmt: skip
    # The held-out slices, chosen before the autoscaler's defaults were tuned on the
    # sections above: the Azure traces 25 minutes later (no default has seen them).
    for name, trace in (("Azure conversation", "azure_llm_2023_conv.csv"),
                        ("Azure code", "azure_llm_2023_code.csv")):
        for startup_s in STARTUPS_S:
            out.append((
                f"Autoscalers on a held-out {name} slice, unified and prefill/decode pools, "
                f"start-up {startup_s} s",
                "The comparison above on trace time no autoscaler default was tuned on: from "
                "2,400 s into the trace instead of 900 s (the held-out slice chosen before the "
                "tuning). " + about.format(sizes=SIZES_16, startup_s=startup_s,
                                            minutes=int(a_dur) // 60), "compare",
                ["--trace", str(TRACES / trace), "--start-s", "2400", "--warmup-s", "300",
                 "--duration-s", a_dur, "--compress", "1", "--startup-s", str(startup_s),
                 "--pool", UNIFIED, "--pool", PD, *scalers, "--optimum"],
            ))  # fmt: skip
    # A constant fleet chosen in hindsight is the baseline a causal scaler has to beat on
    # ON/OFF traffic: it neither holds a spike's count nor meets a burst short.
    for slice_name, start in (("training", "900"), ("held-out", "2400")):
        out.append((
            f"Constant fleets beside the autoscaler on the Azure code {slice_name} slice "
            "(unified pool, start-up 10 s)",
            "kvfleet's autoscaler on the unified pool (2-16 replicas) and the same pool "
            "pinned at 3, 4, 5 and 6 replicas (`--pinned`), each read against the pool's "
            "hindsight optimum; the slice of the Azure code autoscaler section "
            f"(from {start} s). A count that meets the SLO here is chosen knowing the "
            "trace: no scaler could have picked it in advance.", "compare",
            [*azure_code_slice(start, quick), "--pool", UNIFIED, "--scaler", "kvfleet",
             *sum((["--pinned", str(n)] for n in (3, 4, 5, 6)), []), "--optimum"],
        ))  # fmt: skip
    # One router seed decides each autoscaler row above (the oracle's replays rule out
    # more); under bursts the seed moves which replica a clump lands on, so when a
    # window's latency crosses its target and the scaler moves: these rows give kvfleet's
    # spread, read against the optimum of the section with the same slice and start-up.
    for slice_name, start in (("training", "900"), ("held-out", "2400")):
        for startup_s in STARTUPS_S:
            out.append((
                f"kvfleet's autoscaler over router seeds on the Azure code {slice_name} slice "
                f"(start-up {startup_s} s)",
                f"kvfleet's autoscaler on {SIZES_16}, the slice and start-up of the Azure "
                f"code autoscaler section from {start} s at {startup_s} s, at five router "
                "seeds; read its replica-s against that section's optimum (one seed cannot "
                "tell a change of default from the seed's own spread)."
                + SEEDS_NOTE * (not quick) + " Replica-s gives its min-max where it varies.",
                "compare",
                [*azure_code_slice(start, quick, startup_s), "--pool", UNIFIED, "--pool", PD,
                 "--scaler", "kvfleet", *seeds(quick)],
            ))  # fmt: skip
    counts = [2**k for k in range(5 if quick else 9)]  # 1..16 or 1..256
    out.append((
        "Scaling efficiency on the Azure conversation trace (unified pool)",
        "The unified pool pinned at N replicas, for each N the highest rate multiplier over "
        "the same slice at which >= 99% of requests meet the SLO (bisection in log space "
        "to 5%, the first probe at N x the one-replica figure; the table shows the lowest "
        "failing probe in brackets), then efficiency = rate(N) / (N x rate(1)), so each "
        "figure is good to about 5%. The seed research quotes 85-95% at 2-4 nodes, 70-85% "
        "at 8-16 and 50-70% at 32+ (shaded in the plot). This section is most of the "
        "bench's time: every probe at N replicas replays N times the one-replica load.",
        "efficiency",
        ["--trace", str(TRACES / "azure_llm_2023_conv.csv"), "--start-s", "1800",
         "--warmup-s", "10", "--duration-s", "20", "--compress", "1",
         "--pool", UNIFIED, "--replicas", ",".join(map(str, counts)),
         "--slo-attainment", "0.99", "--tolerance", "0.05", "--plot", str(EFFICIENCY_PLOT)],
    ))  # fmt: skip
    return out


def section_span(text: str, title: str) -> tuple[int, int] | None:
    """[start, end) of the section called `title` in `text`: its heading up to the next
    section's heading, or to the end; None when it has none."""
    start = text.find(f"## {title}\n")
    if start < 0:
        return None
    end = text.find("\n## ", start + 1)
    return start, end + 1 if end >= 0 else len(text)


def splice(text: str, titles: list[str], title: str, section: list[str]) -> str:
    """`text` with the section called `title` replaced by `section`, or, where it has none,
    `section` put before the next section of `titles` (the report's order) it has."""
    block = "\n".join(section) + "\n"
    span = section_span(text, title)
    if span is not None:
        start, end = span
        return text[:start] + (block + text[end:] if end < len(text)
                               else block.rstrip("\n") + "\n")
    for later in titles[titles.index(title) + 1:]:
        at = text.find(f"## {later}\n")
        if at >= 0:
            return text[:at] + block + text[at:]
    return text.rstrip("\n") + "\n\n" + block


def drop_retired(text: str, saved: list[dict], titles: list[str]) -> tuple[str, list[dict]]:
    """The report and results without the sections this script no longer makes (a renamed
    or removed section), so a partial rerun cannot leave an old table beside its successor."""
    kept = [r for r in saved if r["title"] in titles]
    for title in re.findall(r"^## (.+)$", text, flags=re.M):
        span = section_span(text, title)
        if title not in titles and span is not None:
            text = text[:span[0]] + text[span[1]:]
    return text.rstrip("\n") + "\n", kept


def longest_first(todo: list[tuple[str, str, str, list[str]]], picked) -> list[int]:
    """Sections in the order to start them: with --jobs 2 the longest (scaling efficiency,
    then the Mooncake ones, 32-replica pools) run beside all the others; the report keeps
    the sections' own order."""
    def cost(i: int) -> int:
        title, _, kind, cmd = todo[i]
        return 2 if kind == "efficiency" else 1 if any("mooncake" in a for a in cmd) else 0
    return sorted(picked, key=cost, reverse=True)


def rerun_sections(todo: list[tuple[str, str, str, list[str]]], args: argparse.Namespace,
                   commit: str) -> int:
    """--only: run the chosen sections and put them into the report and results in place
    (each names the commit it ran on; the others keep theirs). The cheapest start first and
    each is written as it finishes, so a long rerun that is stopped keeps what it finished."""
    picked = [i for i, section in enumerate(todo) if any(t in section[0] for t in args.only)]
    out, saved_path = Path(args.out), RESULTS / "sim_policies.json"
    if not picked or not out.exists() or not saved_path.exists():
        print("sim_policies: --only needs a section title it matches and an existing "
              f"{out.name} and {saved_path.name} to put it into", file=sys.stderr)
        return 2
    text, saved = out.read_text(), json.loads(saved_path.read_text())
    titles = [section[0] for section in todo]
    text, saved = drop_retired(text, saved, titles)
    order = {title: k for k, title in enumerate(titles)}
    done: list[int] = []
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_section, todo[i], i, commit): i
                   for i in longest_first(todo, picked)[::-1]}
        for future in as_completed(futures):
            i = futures[future]
            section_lines, result = future.result()
            text = splice(text, titles, todo[i][0], section_lines)
            result = compact([result])[0]
            saved = [r for r in saved if r["title"] != result["title"]] + [result]
            saved.sort(key=lambda r: order.get(r["title"], len(order)))
            done.append(i)
            saved_path.write_text(json.dumps(saved, indent=1))
            out.write_text(text)
            print(f"wrote {out} ({len(done)}/{len(picked)})", file=sys.stderr, flush=True)
    refresh_section("sim_policies", saved_path)
    return 0


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--jobs", type=int, default=1, help="sections run side by side")
    p.add_argument("--out", default=str(ROOT / "bench" / "sim_policies.md"))
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="rerun only the sections whose title contains TEXT (repeatable), "
                        "each spliced into the existing --out and results file in place")
    args = p.parse_args(argv)
    RESULTS.mkdir(exist_ok=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()  # fmt: skip
    lines = ["# Routing policies, autoscalers and scaling efficiency in the simulator", "",
             f"Generated by `.venv/bin/python bench/sim_policies.py{' --quick' * args.quick}` "
             f"on commit {commit}; the sections rerun since with `--only` (which reruns the "
             "sections whose title contains its text) each name the commit they ran on. "
             "Every figure is deterministic (same seeds, same trace "
             "slice; the routing sections report medians over five router seeds). SLO: "
             "TTFT <= the pool's `ttftP90Seconds` (2 s) and mean ITL <= 50 ms "
             "per request. Prefix hit: prompt tokens found in the engines' prefix caches / "
             "looked up. Imbalance: (max - min) / mean of queue/capacity over the endpoints "
             "taking requests, sampled each second.", ""]  # fmt: skip
    todo = sections(args.quick)
    if args.only:
        return rerun_sections(todo, args, commit)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {i: pool.submit(run_section, todo[i], i, commit)
                   for i in longest_first(todo, range(len(todo)))}
        done = [futures[i].result() for i in range(len(todo))]
    for section_lines, _ in done:
        lines += section_lines
    runs = [result for _, result in done]
    (RESULTS / "sim_policies.json").write_text(json.dumps(compact(runs), indent=1))
    Path(args.out).write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    refresh_section("sim_policies", RESULTS / "sim_policies.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
