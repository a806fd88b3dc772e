"""`kvfleet sim`: replay a trace through a simulated fleet in virtual time.

    kvfleet sim run --trace ../shared/traces/mooncake_conversation.jsonl \\
        --pool sim/pools/h100-llama3-8b-16.yaml --start-s 0 --warmup-s 0 --duration-s 3600 \\
        --compress 1 --scaler fixed-max
    kvfleet sim compare --trace ... --pool a.yaml --policy cache-aware --policy round-robin
    kvfleet sim --trace ... --pool ...   # (no subcommand) compare every scaler, as before
    kvfleet sim gate --baseline old.yaml --candidate new.yaml --trace ...   # exit 1: worse
    kvfleet sim efficiency --trace ... --pool a.yaml --replicas 1,2,4,8 --plot eff.png

`run` replays one configuration; `compare` replays every combination of the given pools,
scalers and policies on the same trace slice and seed, one table (`--seeds N`: each
combination at N router seeds, each column its median, the routing columns with their
min-max, and replica-seconds with theirs where the seeds moved the scaler; one seed's gap
between two policies is often inside that spread); `gate` replays a
baseline and a candidate pool and exits 1 when the candidate's SLO attainment is lower, or
its replica-seconds higher, beyond a tolerance (the check a GitOps pull request runs);
`--scaler oracle` (run, compare) replays the hindsight optimum (`oracle.py`: the fewest
replica-seconds that met the SLO knowing the future, found by many replays; about six
times the slice's arrivals for a 5-minute window at the default 60 s
`--oracle-interval-s` and a 120 s warm-up), and
whenever it is solved the table gains "× optimum", each row's replica-seconds over the
oracle's; `--optimum` solves it for that column without listing it as a row, and
`compare --pinned N` adds each pool fixed at N replicas, read against the same optimum.
`--misses-every S` lists, per run, the S-second windows where requests missed the SLO
(TTFT, ITL, failed) beside the replicas ready then (`report.miss_windows`).
`efficiency` pins the pool at each N replicas and bisects the rate multiplier for the
highest rate that still meets `--slo-attainment`, then prints rate(N) / (N x rate(1))
(`efficiency.py`). `--plot-dir` writes replicas over time against load, TTFT/E2E CDFs
and hit rate per run as PNGs (`plots.py`).
Traces: the Azure LLM CSVs or the Mooncake JSONL (by content). Results (`--json`) are
bit-for-bit reproducible for a given seed. Prefill/decode pools take the router's P/D
path, with the KV hand-off over `--kv-gbytes-per-s` plus `--kv-latency-ms`; pools with
`routing.kvSharing` fetch cached prefixes from peers over `--peer-gbytes-per-s` plus
`--peer-latency-ms` when the router's hint says so (`peer_fetch.py`), and a second table
splits the prefix tokens reused into local and fetched. Mooncake rows may name a `tenant`
and a `priority` (the router's flow control, `routing.flowControl`, schedules them); with
more than one tenant a third table gives each tenant's requests, served, refused, TTFT
and served tokens. `--rollout-at T` (run, compare) changes what the engines run at
virtual second T (`--rollout-profile`, a build `--rollout-slowdown` times slower) and the
control loop rolls it out by the pool's `spec.rollout` (or `--rollout-strategy`): the
report adds the rollout's outcome (its events, where it ended, failed requests, and what the
router measured per revision; `rollout.py`). Bad flags, an
unreadable or malformed trace, an impossible rate or a pool the simulator cannot model end
with one line on stderr and exit 2.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kvfleet_operator.api.spec import ROLLOUT_STRATEGIES

from kvfleet_sim import efficiency, oracle, plots
from kvfleet_sim.fleet import SimError, SimSettings
from kvfleet_sim.report import MissWindow, Summary, median_summary, miss_windows
from kvfleet_sim.rollout import RolloutScenario, summary_line
from kvfleet_sim.run import MAX_PINNED, POLICIES, SimRun, Variant, run_variants
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceError, TraceRequest

COMMANDS = ("run", "compare", "gate", "efficiency")
SCALER_CHOICES = sorted([*SCALERS, oracle.ORACLE])
PEER_GBYTES_PER_S = SimSettings().peer_bytes_per_s / 1e9
PEER_LATENCY_MS = SimSettings().peer_latency_s * 1000


class CLIError(Exception):
    """A one-line, user-facing reason to stop."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CLIError(message)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--trace", required=True, help="Azure LLM trace CSV or Mooncake JSONL")
    p.add_argument("--start-s", type=float, default=1800.0, help="slice start in the trace")
    p.add_argument("--duration-s", type=float, default=600.0, help="measured slice length")
    p.add_argument("--warmup-s", type=float, default=120.0,
                   help="trace time replayed before the slice, not measured")  # fmt: skip
    p.add_argument("--compress", type=float, default=4.0, help="time compression factor")
    p.add_argument("--rate", type=float, default=1.0,
                   help="request-rate multiplier over the same span")  # fmt: skip
    p.add_argument("--startup-s", type=float, default=10.0, help="replica provisioning time")
    p.add_argument("--seed", type=int, default=0, help="the router's random seed")
    p.add_argument("--prefix-mode", choices=("approximate", "precise"), default=None,
                   help="override the endpoints' prefix index mode (default: the pool's)")
    p.add_argument("--replica-profile", action="append", default=None, metavar="PROFILE",
                   help="repeatable: cost profiles (name or .json path) the replicas take "
                        "in turn, in creation order (default: the pool's engine.profile)")
    p.add_argument("--kv-gbytes-per-s", type=float, default=50.0,
                   help="P/D: the prefill-to-decode KV link, GB/s")  # fmt: skip
    p.add_argument("--kv-latency-ms", type=float, default=2.0,
                   help="P/D: fixed latency per KV hand-off")  # fmt: skip
    p.add_argument("--peer-gbytes-per-s", type=float, default=PEER_GBYTES_PER_S,
                   help="routing.kvSharing: the link a peer prefix fetch crosses, GB/s")
    p.add_argument("--peer-latency-ms", type=float, default=PEER_LATENCY_MS,
                   help="routing.kvSharing: fixed latency per peer prefix fetch")
    p.add_argument("--ttft-slo", type=float, default=None, help="default: the pool's target")
    p.add_argument("--itl-slo", type=float, default=None, help="default: pool's, else 0.05")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="a progress bar on stderr (tqdm; default: when stderr is a terminal)")


def _outputs(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", default=None, help="write summaries and timelines here")
    p.add_argument("--plot", default=None, help="write a replicas-over-time PNG here")
    p.add_argument("--plot-dir", default=None,
                   help="write replicas.png (against load), latency_cdf.png, hit_rate.png")
    p.add_argument("--misses-every", type=float, default=None, metavar="SECONDS",
                   help="after the table, per run, the windows of this length (virtual "
                        "seconds from the end of warm-up) where requests missed the SLO: "
                        "arrivals, TTFT and ITL misses, failures, replicas ready")


def _optimum(p: argparse.ArgumentParser) -> None:
    p.add_argument("--optimum", action="store_true",
                   help="also solve the hindsight optimum (oracle.py) for the × optimum "
                        "column, without listing it as a run")  # fmt: skip
    p.add_argument("--oracle-interval-s", type=float, default=oracle.DEFAULT_INTERVAL_S,
                   help="the oracle's plan interval, virtual seconds (coarser: fewer "
                        "replays, a looser optimum)")  # fmt: skip


def _rollout(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rollout-at", type=float, default=None, metavar="SECONDS",
                   help="roll out a new engine revision at this virtual second of the replay "
                        "(warm-up included; after --compress)")
    p.add_argument("--rollout-profile", default=None, metavar="PROFILE",
                   help="the new revision's engine.profile (default: the pool's)")
    p.add_argument("--rollout-slowdown", type=float, default=None, metavar="FACTOR",
                   help="the new build's step times over its profile's (2: twice as slow; "
                        "default 1)")
    p.add_argument("--rollout-strategy", choices=ROLLOUT_STRATEGIES, default=None,
                   help="in place of the pool's spec.rollout.strategy")


def rollout_of(args: argparse.Namespace) -> RolloutScenario | None:
    at = getattr(args, "rollout_at", None)
    rest = {"--rollout-profile": getattr(args, "rollout_profile", None),
            "--rollout-slowdown": getattr(args, "rollout_slowdown", None),
            "--rollout-strategy": getattr(args, "rollout_strategy", None)}
    if at is None:
        if given := [flag for flag, v in rest.items() if v is not None]:
            raise CLIError(f"{given[0]} needs --rollout-at")
        return None
    slowdown = args.rollout_slowdown if args.rollout_slowdown is not None else 1.0
    return RolloutScenario(at, args.rollout_profile, slowdown, args.rollout_strategy)


def replica_list(text: str) -> list[int]:
    """`1,2,4,8` -> [1, 2, 4, 8] (argparse type)."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") \
            from None  # fmt: skip
    try:
        return efficiency.check_replicas(counts)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def pinned_count(text: str) -> int:
    """A replica count to pin a pool at (argparse type): 1..MAX_PINNED."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not 1 <= n <= MAX_PINNED:
        raise argparse.ArgumentTypeError(f"must be in 1..{MAX_PINNED}, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvfleet sim", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="replay one configuration")
    _common(run)
    _outputs(run)
    run.add_argument("--pool", required=True, help="InferencePool YAML (builtin, simulated)")
    _optimum(run)
    run.add_argument("--scaler", choices=SCALER_CHOICES, default="kvfleet")
    run.add_argument("--policy", choices=sorted(POLICIES), default=None,
                     help="routing policy in place of the pool's")  # fmt: skip
    _rollout(run)
    cmp = sub.add_parser("compare", help="several pools, scalers or policies, one table")
    _common(cmp)
    _outputs(cmp)
    cmp.add_argument("--pool", action="append", required=True, help="repeatable")
    _optimum(cmp)
    cmp.add_argument("--scaler", action="append", choices=SCALER_CHOICES,
                     help="repeatable; default: every reactive one (all but oracle)")
    cmp.add_argument("--policy", action="append", choices=sorted(POLICIES),
                     help="repeatable; default: each pool's own")  # fmt: skip
    cmp.add_argument("--pinned", action="append", type=pinned_count, default=None,
                     metavar="N",
                     help="repeatable: also each pool pinned at N replicas per role (rows "
                          "'fixed at N'; with --optimum read against the pool's optimum)")
    cmp.add_argument("--seeds", type=int, default=1,
                     help="run everything with the router seeds --seed ... --seed + N - 1; "
                          "each column is its median over them, SLO met, prefix hit, "
                          "imbalance and max share with their min-max, replica-s with its "
                          "own where it varies")
    _rollout(cmp)
    gate = sub.add_parser("gate", help="exit 1 when a candidate pool is worse than a baseline")
    _common(gate)
    _outputs(gate)
    gate.add_argument("--baseline", required=True, help="InferencePool YAML in force")
    gate.add_argument("--candidate", required=True, help="InferencePool YAML proposed")
    gate.add_argument("--scaler", choices=sorted(SCALERS), default="kvfleet")
    gate.add_argument("--slo-tolerance", type=float, default=0.005,
                      help="SLO attainment the candidate may lose (absolute fraction)")
    gate.add_argument("--cost-tolerance", type=float, default=0.05,
                      help="replica-seconds the candidate may add (relative)")  # fmt: skip
    eff = sub.add_parser("efficiency", help="scaling efficiency at N = 1, 2, 4, ... replicas")
    _common(eff)
    eff.add_argument("--pool", required=True, help="InferencePool YAML, pinned at each N")
    eff.add_argument("--replicas", type=replica_list, default=[1, 2, 4, 8],
                     help="comma-separated replica counts (1 is always measured)")
    eff.add_argument("--slo-attainment", type=float, default=0.99,
                     help="the fraction of requests that must meet the SLO")  # fmt: skip
    eff.add_argument("--tolerance", type=float, default=efficiency.DEFAULT_TOLERANCE,
                     help="bisection stops at hi / lo <= 1 + this")  # fmt: skip
    for action in eff._actions:
        if action.dest == "rate":
            action.help = "the first rate multiplier tried for one replica"
    eff.add_argument("--json", default=None, help="write every point and probe here")
    eff.add_argument("--plot", default=None, help="write the efficiency-vs-N PNG here")
    return p


def run_miss_windows(run: SimRun, ttft_slo: float, itl_slo: float, every_s: float
                     ) -> list[MissWindow]:
    return miss_windows(run.result, ttft_slo, itl_slo, run.start_s,
                        run.start_s + run.summary.duration_s, every_s)


def format_miss_windows(name: str, windows: list[MissWindow], every_s: float) -> str:
    """The windows of one run where a request missed the SLO (the others left out), and
    how many there were."""
    missed = [w for w in windows if w.num_missed]
    lines = [f"\n{name}: SLO misses by {every_s:g} s window from the end of warm-up "
             f"({len(missed)} of {len(windows)} windows)"]
    if missed:
        lines += ["| window (s) | arrivals | TTFT missed | ITL missed | failed | "
                  "replicas ready (most) |", "|---|---|---|---|---|---|"]
        lines += [f"| {w.start_s:g}-{w.start_s + every_s:g} | {w.num_arrivals} | "
                  f"{w.num_ttft_missed} | {w.num_itl_missed} | {w.num_failed} | "
                  f"{w.max_ready} |" for w in missed]
    return "\n".join(lines)


def gate_verdict(base: Summary, cand: Summary, slo_tol: float, cost_tol: float) -> list[str]:
    """Why the candidate fails the gate; empty when it passes."""
    why = []
    if cand.slo_attainment < base.slo_attainment - slo_tol:
        why.append(f"SLO attainment {cand.slo_attainment:.2%} < baseline "
                   f"{base.slo_attainment:.2%} - {slo_tol:.2%}")  # fmt: skip
    if cand.replica_seconds > base.replica_seconds * (1 + cost_tol):
        why.append(f"replica-seconds {cand.replica_seconds:.0f} > baseline "
                   f"{base.replica_seconds:.0f} + {cost_tol:.0%}")  # fmt: skip
    return why


def variants_of(args: argparse.Namespace) -> list[Variant]:
    if args.command == "run":
        return [Variant(args.pool, args.scaler, args.policy)]
    if args.command == "gate":
        return [Variant(args.baseline, args.scaler), Variant(args.candidate, args.scaler)]
    scalers = args.scaler or list(SCALERS)  # the oracle only when asked for: many replays
    policies: list[str | None] = list(args.policy) if args.policy else [None]
    pinned = [Variant(pool, "fixed-max", policy, n) for pool, policy, n in
              itertools.product(args.pool, policies, sorted(set(args.pinned or ())))]
    return [*(Variant(pool, scaler, policy)
              for pool, policy, scaler in itertools.product(args.pool, policies, scalers)),
            *pinned]


def _ms(*values: float) -> str:
    return " / ".join(f"{v * 1000:.0f}" for v in values)


def format_table(summaries: list[Summary], ttft_slo: float, itl_slo: float) -> str:
    """One row per run; a "× optimum" column after replica-s when the oracle was solved
    (a run without an optimum of its own shows "-")."""
    has_optimum = any(s.x_optimum is not None for s in summaries)
    head = (
        f"| run | SLO met (TTFT<={ttft_slo:g}s, ITL<={itl_slo * 1000:g}ms) | prefix hit "
        "| TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 / p99 (ms) | E2E p50 / p90 / p99 (s) "
        "| imbalance mean / p90 | replica-s |" + (" × optimum |" if has_optimum else "")
        + " mean / max replicas | scale events | failed | max share | perf MAPE TTFT / TPOT |"
    )
    rows = [head, "|" + "---|" * (13 + has_optimum)]
    for s in summaries:
        ratio = "-" if s.x_optimum is None else f"{s.x_optimum:.2f}x"
        rows.append(
            f"| {s.name} | {_spread(s, 'slo_attainment', 100, '.1f', '%')} "
            f"| {_spread(s, 'prefix_hit_rate', 100, '.1f', '%')} "
            f"| {_ms(s.ttft_p50_s, s.ttft_p90_s, s.ttft_p99_s)} "
            f"| {_ms(s.itl_p50_s, s.itl_p90_s, s.itl_p99_s)} "
            f"| {s.e2e_p50_s:.1f} / {s.e2e_p90_s:.1f} / {s.e2e_p99_s:.1f} "
            f"| {_spread(s, 'imbalance_mean', 1, '.2f')} / {s.imbalance_p90:.2f} "
            f"| {_spread(s, 'replica_seconds', 1, '.0f', only_if_varies=True)} "
            + (f"| {ratio} " if has_optimum else "")
            + f"| {s.mean_replicas:.2f} / {s.max_replicas} | {s.num_scale_events} "
            f"| {s.num_failed} | {_spread(s, 'max_share', 1, '.2f')} "
            f"| {_mape(s.ttft_mape, s.tpot_mape)} |"
        )
    return "\n".join(rows)


def _spread(s: Summary, key: str, scale: float, fmt: str, unit: str = "",
            only_if_varies: bool = False) -> str:
    """A cell: the value, and over several seeds its min-max after it ("93.4% (93.2-94.0)");
    with `only_if_varies`, the value alone where every seed gave the same (a fleet fixed at
    its size spends the same replica-seconds whatever the routing)."""
    cell = f"{getattr(s, key) * scale:{fmt}}{unit}"
    if s.spread is None:
        return cell
    lo, hi = s.spread[key]
    if only_if_varies and lo == hi:
        return cell
    return f"{cell} ({lo * scale:{fmt}}-{hi * scale:{fmt}})"


def _mape(*values: float | None) -> str:
    return " / ".join("-" if v is None else f"{v:.0%}" for v in values)


def format_peer_table(summaries: list[Summary]) -> str:
    """Prefix reuse and KV moved, for the runs whose pool shares KV (`routing.kvSharing`)."""
    rows = ["| run | prefix tokens reused: local / fetched | fetched blocks | bytes moved "
            "| hints attached / asked | fetch outcomes | mean fetch (ms) |", "|" + "---|" * 7]
    for s in summaries:
        if (p := s.peer) is None:
            continue
        hints = p["hints"]
        outcomes = ", ".join(f"{k} {v}" for k, v in p["fetches"].items()) or "-"
        rows.append(
            f"| {s.name} | {p['prefix_tokens_local']:,} / {p['prefix_tokens_fetched']:,} "
            f"| {p['fetched_blocks']:,} | {p['bytes_moved'] / 1e9:.2f} GB "
            f"| {hints.get('attached', 0)} / {sum(hints.values())} | {outcomes} "
            f"| {p['fetch_mean_s'] * 1000:.1f} |"
        )
    return "\n".join(rows)


def format_tenant_table(summaries: list[Summary]) -> str:
    """Per tenant, for the runs whose trace has more than one (`Summary.tenants`)."""
    rows = ["| run | tenant | requests | served | refused | other failed "
            "| TTFT p50 / p90 / p99 (ms) | served tokens |", "|" + "---|" * 8]
    for s in summaries:
        for name, t in (s.tenants or {}).items():
            rows.append(
                f"| {s.name} | {name} | {t['num_requests']} | {t['num_served']} "
                f"| {t['num_refused']} | {t['num_failed']} "
                f"| {_ms(t['ttft_p50_s'], t['ttft_p90_s'], t['ttft_p99_s'])} "
                f"| {t['served_tokens']:,} |"
            )
    return "\n".join(rows)


def format_rollout(runs: list[SimRun]) -> str:
    """Per run with a rollout: where it ended, then one row per revision (what the router
    measured: attempts, errors, TTFT and ITL p90; requests answered; replicas at the end)."""
    lines = []
    rows = ["| run | revision | requests | errors | TTFT p90 (ms) | ITL p90 (ms) | answered "
            "| replicas at end |", "|" + "---|" * 8]
    for r in runs:
        out = r.result.rollout
        if out is None:
            continue
        strategy = (out["status"] or {}).get("strategy") or out["scenario"]["strategy"] or ""
        lines.append(f"rollout ({r.name}): {strategy} {out['from_revision'] or '?'} -> "
                     f"{out['to_revision'] or '?'} at {out['scenario']['at_s']:g} s: "
                     f"{summary_line(out)}; failed requests {out['num_failed']}")
        for rev, c in out["revisions"].items():
            mark = " (new)" if rev == out["to_revision"] else ""
            rows.append(f"| {r.name} | {rev}{mark} | {c['requests']} | {c['errors']} "
                        f"| {_opt_ms(c['ttft_p90_s'])} | {_opt_ms(c['itl_p90_s'])} "
                        f"| {c['served']} | {c['replicas_at_end']} |")
    return "\n".join([*lines, *rows])


def _opt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:.1f}"


def args_json(args: argparse.Namespace, skip: tuple[str, ...]) -> dict[str, object]:
    """The flags for --json; the peer-link, oracle and rollout flags only when set (older
    JSON stays as it was)."""
    out = {k: v for k, v in vars(args).items() if k not in skip}
    for key, default in (("peer_gbytes_per_s", PEER_GBYTES_PER_S),
                         ("peer_latency_ms", PEER_LATENCY_MS), ("optimum", False),
                         ("oracle_interval_s", oracle.DEFAULT_INTERVAL_S)):
        if out.get(key) == default:
            out.pop(key, None)
    for key in ("rollout_at", "rollout_profile", "rollout_slowdown", "rollout_strategy"):
        if out.get(key) is None:
            out.pop(key, None)
    return out


Progress = Callable[[list[TraceRequest], str], Callable[[int], None]]


def progress_bars(enabled: bool) -> Progress | None:
    if not enabled:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None

    def make(trace: list[TraceRequest], label: str) -> Callable[[int], None]:
        bar = tqdm(total=len(trace), desc=label, unit="req", file=sys.stderr, leave=False)

        def update(n: int) -> None:
            bar.update(n - bar.n)
            if n >= len(trace):
                bar.close()

        return update

    return make


def probe_line(enabled: bool) -> tuple[Callable[[int, float, Summary], None] | None,
                                       Callable[[], None]]:  # fmt: skip
    """(efficiency's on_probe, close): one tqdm line counting replays, naming the last."""
    if not enabled:
        return None, lambda: None
    try:
        from tqdm import tqdm
    except ImportError:
        return None, lambda: None
    bar = tqdm(desc="scaling efficiency", unit="replay", file=sys.stderr)

    def on_probe(n: int, rate: float, summary: Summary) -> None:
        bar.update(1)
        bar.set_postfix_str(f"N={n} rate x{rate:.3g}: SLO met {summary.slo_attainment:.1%}")

    return on_probe, bar.close


def check_seeds(args: argparse.Namespace) -> None:
    """--seeds repeats reactive runs; the oracle's replays are hours at several seeds."""
    seeds = getattr(args, "seeds", 1)
    if seeds < 1:
        raise CLIError(f"--seeds must be >= 1, got {seeds}")
    if seeds > 1 and (getattr(args, "optimum", False) or oracle.ORACLE in (args.scaler or [])):
        raise CLIError("--seeds > 1 takes reactive scalers only: drop --optimum and "
                       "--scaler oracle, or run them with one seed")


def settings_of(args: argparse.Namespace) -> SimSettings:
    return SimSettings(startup_s=args.startup_s, seed=args.seed, prefix_mode=args.prefix_mode,
                       kv_bytes_per_s=args.kv_gbytes_per_s * 1e9,
                       kv_latency_s=args.kv_latency_ms / 1000,
                       peer_bytes_per_s=args.peer_gbytes_per_s * 1e9,
                       peer_latency_s=args.peer_latency_ms / 1000,
                       replica_profiles=tuple(args.replica_profile or ()),
                       rollout=rollout_of(args))  # fmt: skip


def _stderr_line(line: str) -> None:
    """The oracle's progress (one line per interval settled): on unless --no-progress."""
    print(line, file=sys.stderr, flush=True)


def _fail(exc: Exception) -> int:
    print(f"kvfleet sim: {str(exc).splitlines()[0]}", file=sys.stderr)
    return 2


ERRORS = (CLIError, SimError, TraceError, ValueError, OSError)


def make_output_dirs(args: argparse.Namespace) -> None:
    """Create the folders of --json and --plot before a run that may take minutes, so a
    path that cannot be written fails at once, in one line."""
    for flag in ("json", "plot"):
        path = getattr(args, flag, None)
        if path:
            try:
                Path(path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise CLIError(f"--{flag} {path}: cannot create its folder: "
                               f"{exc.strerror or exc}") from None


def main_efficiency(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    show = sys.stderr.isatty() if args.progress is None else args.progress
    on_probe, close = probe_line(show)
    try:
        points, ttft_slo, itl_slo = efficiency.measure(
            args.trace, args.pool, args.replicas, start_s=args.start_s,
            duration_s=args.duration_s, warmup_s=args.warmup_s, compress=args.compress,
            settings=settings_of(args), slo_attainment=args.slo_attainment,
            tol=args.tolerance, first_guess=args.rate, ttft_slo_s=args.ttft_slo,
            itl_slo_s=args.itl_slo, progress=progress_bars(show), on_probe=on_probe,
        )  # fmt: skip
    except ERRORS as exc:
        return _fail(exc)
    finally:
        close()
    print(f"SLO: {args.slo_attainment:.1%} of requests with TTFT <= {ttft_slo:g} s and mean "
          f"ITL <= {itl_slo * 1000:g} ms")  # fmt: skip
    print(efficiency.format_table(points))
    probes = sum(len(p.probes) for p in points)
    print(f"({probes} replays in {time.perf_counter() - started:.0f} s wall)")
    if args.json:
        settings = args_json(args, ("json", "plot", "progress"))
        out = {"args": settings, "ttft_slo_s": ttft_slo, "itl_slo_s": itl_slo,
               "slo_attainment": args.slo_attainment, "tolerance": args.tolerance,
               "points": [p.to_dict() for p in points]}  # fmt: skip
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.plot:
        plots.plot_efficiency(args.plot, points, f"{Path(args.pool).name}, "
                              f"SLO met by >= {args.slo_attainment:.0%}")  # fmt: skip
    return 0


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in COMMANDS and argv[0] not in ("-h", "--help"):
        argv = ["compare", *argv]  # `kvfleet sim --trace ... --pool ...`, as before
    try:
        args = build_parser().parse_args(argv)
        if args.command == "gate" and not (args.slo_tolerance >= 0 and args.cost_tolerance >= 0):
            raise CLIError("--slo-tolerance and --cost-tolerance must be >= 0")
        if not getattr(args, "oracle_interval_s", 1.0) > 0:
            raise CLIError("--oracle-interval-s must be > 0")
        if getattr(args, "misses_every", None) is not None and not args.misses_every > 0:
            raise CLIError(f"--misses-every must be > 0, got {args.misses_every:g}")
        check_seeds(args)
        make_output_dirs(args)
    except ERRORS as exc:
        return _fail(exc)
    if args.command == "efficiency":
        return main_efficiency(args)
    try:
        started = time.perf_counter()
        show = sys.stderr.isatty() if args.progress is None else args.progress
        by_seed = []
        for seed in range(args.seed, args.seed + getattr(args, "seeds", 1)):
            runs, ttft_slo, itl_slo = run_variants(
                trace_path=args.trace, variants=variants_of(args),
                start_s=args.start_s, duration_s=args.duration_s, warmup_s=args.warmup_s,
                compress=args.compress, rate=args.rate,
                settings=dataclasses.replace(settings_of(args), seed=seed),
                ttft_slo_s=args.ttft_slo, itl_slo_s=args.itl_slo,
                progress=progress_bars(show), optimum=getattr(args, "optimum", False),
                oracle_interval_s=getattr(args, "oracle_interval_s",
                                          oracle.DEFAULT_INTERVAL_S),
                log=None if args.progress is False else _stderr_line,
            )  # fmt: skip
            by_seed.append(runs)
    except ERRORS as exc:
        return _fail(exc)
    runs = by_seed[0]  # timelines, plots and rollouts: the first seed's
    summaries = [median_summary([rs[i].summary for rs in by_seed]) for i in range(len(runs))]
    if args.command == "gate":
        for s, role in zip(summaries, ("baseline", "candidate"), strict=True):
            s.name = f"{role}: {s.name}"
    print(format_table(summaries, ttft_slo, itl_slo))
    if any(s.peer is not None for s in summaries):
        print(format_peer_table(summaries))
    if any(s.tenants is not None for s in summaries):
        print(format_tenant_table(summaries))
    if any(r.result.rollout is not None for r in runs):
        print(format_rollout(runs))
    for r in runs:
        if r.oracle is not None and r.oracle.misses:
            print(f"note: {r.name}: intervals {[k + 1 for k in r.oracle.misses]} stay under "
                  "their target after the repairs; its × optimum is against a plan that "
                  "missed the SLO there")  # fmt: skip
    windows = [run_miss_windows(r, ttft_slo, itl_slo, args.misses_every) for r in runs] \
        if args.misses_every else []  # fmt: skip
    first_seed = f" (seed {args.seed})" if len(by_seed) > 1 else ""  # the table's medians
    for r, ws in zip(runs, windows, strict=False):  # none without --misses-every
        print(format_miss_windows(r.name + first_seed, ws, args.misses_every))
    num_runs = sum(len(rs) for rs in by_seed)
    print(f"({num_runs} runs in {time.perf_counter() - started:.0f} s wall)")
    if args.json:
        skip = ("json", "plot", "plot_dir", "progress")
        settings = args_json(args, skip)
        runs_out = [r.to_dict() for r in runs]
        out = {"args": settings, "ttft_slo_s": ttft_slo, "itl_slo_s": itl_slo,
               "runs": runs_out}  # fmt: skip
        for run_dict, ws in zip(runs_out, windows, strict=False):
            run_dict["miss_windows"] = [w.to_dict() for w in ws]
        if len(by_seed) > 1:  # the first seed's runs stay in "runs", whole
            out["medians"] = [s.to_dict() for s in summaries]
            out["summaries_by_seed"] = [[r.summary.to_dict() for r in rs] for rs in by_seed]
        Path(args.json).write_text(json.dumps(out, indent=1))
    if args.plot:
        plots.plot_replicas(args.plot, runs)
    if args.plot_dir:
        for path in plots.write_all(args.plot_dir, runs):
            print(f"wrote {path}")
    if args.command == "gate":
        why = gate_verdict(summaries[0], summaries[1], args.slo_tolerance, args.cost_tolerance)
        print("gate: " + ("; ".join(why) if why else "candidate is no worse than baseline"))
        return 1 if why else 0
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
