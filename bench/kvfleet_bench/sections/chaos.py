"""bench/chaos.py: a seeded schedule of faults under steady load, one run per seed."""

from __future__ import annotations

from typing import Any

from kvfleet_bench.sections._fmt import code, table

FILES = ("chaos_seed1", "chaos_seed2")

KIND_TEXT = {
    "engine_kill": "engine SIGKILL",
    "engine_hang": "engine SIGSTOP past the idle timeout",
    "router_kill": "router replica A SIGKILL",
    "loop_kill": "control loop (`kvfleet up`) SIGKILL + restart",
    "net_latency": "slow path to an engine (proxy latency)",
    "net_drop": "connections to an engine reset",
    "net_truncate": "answers from an engine cut short",
    "scrape_garbage": "an engine's /metrics answers garbage",
    "none": "no fault active",
}


TIMED = ("engine_hang", "loop_kill", "net_latency", "net_drop", "net_truncate",
         "scrape_garbage")  # the cause lasts a while: SIGCONT, restart, proxy back to pass


def _causes(d: dict[str, int]) -> str:
    return ", ".join(f"{n} {cause}" for cause, n in d.items()) or "0"


def _rec(d: dict[str, Any] | None) -> str:
    return f"{d['p50']:.1f} / {d['max']:.1f}" if d else "–"


def _left(s: dict[str, Any]) -> str:
    left = s["leftovers"]
    problems = [f"{k}: {v}" for k, v in left.items()
                if k not in ("ports_checked", "state_is_stopped") and v]
    if not left.get("state_is_stopped"):
        problems.append("state not marked stopped")
    checked = (f"{left['ports_checked']} ports, processes by environment marker, drains and "
               f"both routers' configs checked")
    return f"none ({checked})" if not problems else "**" + "; ".join(problems) + "**"


def render_chaos(results: dict[str, Any]) -> str:
    runs = [results[stem] for stem in FILES if stem in results]
    if not runs:
        return "No stored run yet."
    out = []
    for r in runs:
        out += [code(".venv/bin/" + r["summary"]["command"])]
    first = runs[0]["summary"]
    when = "; ".join(f"seed {r['summary']['seed']} {r['summary']['date']} on commit "
                     f"{r['summary']['commit']}" for r in runs)
    out += ["", f"Measured {when}: three simulated-H100 "
            f"engines, two router replicas, {first['rate']:g} requests/s round-robin over "
            "them (completions and chat, streamed and not, greedy, 16–48 tokens). Router "
            f"idle timeout {first['idle_timeout_s']:g} s.", ""]
    header = [""] + [f"seed {r['summary']['seed']}" for r in runs]

    def row(label: str, fn: Any) -> list[str]:
        return [label] + [fn(r["summary"]) for r in runs]

    def mig(s: dict[str, Any]) -> str:
        m = s["migrations"]
        return (f"{m.get('continued', 0)} continued, {m.get('exhausted', 0)} exhausted, "
                f"{m.get('failed', 0)} failed")

    out.append(table(header, [
        row("faults injected (delayed past their time by a recovery)",
            lambda s: f"{s['num_faults']} ({s['num_delayed_faults']})"),
        row("run length (s)", lambda s: f"{s['wall_s']:.0f}"),
        row("requests sent", lambda s: f"{s['num_sent']:,}"),
        row("succeeded", lambda s: f"{s['num_ok']:,}"),
        row("failed, by cause", lambda s: f"{s['num_failed']} ({_causes(s['failed_by_cause'])})"
            if s["num_failed"] else "0"),
        row("streams migrated (router counters)", mig),
        row("recovery to full capacity, p50 / max (s)", lambda s: _rec(s["recovery_s"])),
        row("faults not recovered within the limit", lambda s: str(s["num_not_recovered"])),
        row("router A kills: failed / in flight on A at the kill",
            lambda s: f"{s['router_kill_failed']} / {s['router_kill_in_flight']}"),
        row("router A config version went backwards", lambda s: str(
            s["router_a_version_regressions"])),
        row("engine processes after each loop restart (3 wanted)", lambda s: ", ".join(
            map(str, s.get("num_engine_processes_after_loop_kills", []))) or "–"),
        row("left behind after the run", _left),
    ]))
    kinds = [k for k in KIND_TEXT if k != "none" and any(
        k in r["summary"]["faults_by_kind"] for r in runs)]
    out += ["", "Per fault kind: faults injected, failed requests charged to it, recovery "
            "to full capacity p50 / max in s from the injection (and from the moment the "
            "cause was removed, for faults that last):", ""]
    rows = []
    for kind in [*kinds, "none"]:
        cells = []
        for r in runs:
            s = r["summary"]
            failed = sum(s["failed_by_fault"].get(kind, {}).values())
            if kind == "none":
                cells.append(f"{failed} failed")
                continue
            after = s.get("recovery_after_clear_s_by_kind", {}).get(kind)
            timed = f" ({_rec(after)} once cleared)" if kind in TIMED else ""
            cells.append(f"faults {s['faults_by_kind'].get(kind, 0)}, failed {failed}, "
                         f"recovery {_rec(s['recovery_s_by_kind'].get(kind))}{timed}")
        rows.append([KIND_TEXT[kind]] + cells)
    out.append(table(["fault"] + header[1:], rows))
    return "\n".join(out)
