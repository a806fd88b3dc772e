"""Human-readable views of a local fleet's state (pure: state dict in, lines out).

`kvfleet up` prints `summary_line` whenever it changes and each event as it happens;
`kvfleet status` prints `render_status` from the state file, from another terminal.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

# Signals shown per role, in this order, when the scrape produced them.
_SIGNAL_LABELS = (
    ("num_waiting", "waiting"),
    ("num_running", "running"),
    ("kv_usage_mean", "kv"),
    ("ttft_p90_s", "ttft90"),
    ("request_rate", "req/s"),
)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def role_counts(state: dict[str, Any]) -> dict[str, tuple[int, int, int, int]]:
    """role -> (ready, draining or stopping, total alive, desired)."""
    counts: dict[str, tuple[int, int, int, int]] = {}
    desired: dict[str, int] = state.get("desired", {})
    for role in desired:
        counts[role] = (0, 0, 0, int(desired[role]))
    for rep in state.get("replicas", []):
        role = rep["role"]
        if role == "router":
            continue
        ready, leaving, alive, want = counts.get(role, (0, 0, 0, int(desired.get(role, 0))))
        is_leaving = rep["state"] in ("draining", "stopping")
        counts[role] = (ready + (rep["state"] == "ready"), leaving + is_leaving, alive + 1, want)
    return counts


def summary_line(state: dict[str, Any]) -> str:
    parts = []
    for role, (ready, leaving, alive, want) in sorted(role_counts(state).items()):
        text = f"{role} {ready}/{want}"
        if leaving:
            text += f" ({leaving} draining)"
        if alive - ready - leaving:
            text += f" ({alive - ready - leaving} not ready)"
        signals = state.get("signals", {}).get(role, {})
        shown = [
            f"{label} {_fmt(signals[key])}"
            for key, label in _SIGNAL_LABELS
            if signals.get(key) is not None
        ]
        if signals.get("num_unknown"):
            shown.append(f"unknown {signals['num_unknown']}")
        if shown:
            text += " [" + ", ".join(shown) + "]"
        parts.append(text)
    held = state.get("router", {}).get("num_held")
    if held:
        parts.append(f"held {held}")
    return " | ".join(parts) if parts else "no replicas"


def conditions_line(state: dict[str, Any]) -> str:
    """`Ready=True (AllReplicasReady), ...` from the kstatus-style conditions."""
    conditions = state.get("status", {}).get("conditions", [])
    return ", ".join(
        f"{c.get('type')}={c.get('status')} ({c.get('reason')})" for c in conditions
    ) or "unknown"


def rollout_line(state: dict[str, Any]) -> str:
    """The rollout, in one line: which revision serves, and one under way or rolled back."""
    r = state.get("status", {}).get("rollout") or {}
    if not r.get("stableRevision"):
        return ""
    text = f"{r.get('strategy', '?')}, revision {r['stableRevision']} stable"
    if r.get("phase") in ("Progressing", "Paused") and r.get("canaryRevision"):
        text += (f"; {r['phase'].lower()}: revision {r['canaryRevision']} at "
                 f"{r.get('weight', 0)}% (step {r.get('step', 0)}/{r.get('numSteps', 0)})")
    if r.get("message") and r.get("phase") != "Stable":
        text += f": {r['message']}"
    return text


def render_status(state: dict[str, Any], is_running: bool, now: float | None = None,
                  left_running: Sequence[str] = ()) -> list[str]:  # fmt: skip
    """`left_running`: the processes a killed `up` left serving (none while it runs)."""
    now = time.time() if now is None else now
    age = now - float(state.get("updated_at", now))
    if not is_running and left_running:
        up = (f"gone (killed); {len(left_running)} processes it started still serve: "
              f"{', '.join(left_running)}; `kvfleet up` on this state dir adopts them")
        status = f"no control loop; when it last ran: {conditions_line(state)}"
        serving = "router" in left_running
        endpoint = f"{state.get('endpoint', '?')} " + (
            "(serving, without a control loop)" if serving else "(not serving: no router)")
    elif is_running:
        up = f"running, pid {state.get('pid')}"
        status = conditions_line(state)
        endpoint = state.get("endpoint", "?")
        if not state.get("is_serving", True):
            endpoint += " (not serving yet: replicas are starting)"
    else:  # what it said while it ran is no longer true
        up = "stopped" if state.get("is_stopped") else "stopped (its `kvfleet up` is gone)"
        status = f"stopped; when it last ran: {conditions_line(state)}"
        endpoint = f"{state.get('endpoint', '?')} (not serving)"
    lines = [
        f"pool      {state.get('pool', '?')}",
        f"state     {state.get('state_dir', '?')}",
        f"endpoint  {endpoint}",
        f"up        {up} (state written {age:.0f}s ago)",
        f"router    config version {state.get('router', {}).get('config_version', '?')}",
        f"replicas  {summary_line(state) if is_running else 'none'}",
        f"status    {status}",
    ]
    if line := rollout_line(state):
        lines.append(f"rollout   {line}")
    for role, rs in sorted(state.get("status", {}).get("roles", {}).items()):
        decision = rs.get("lastScaleDecision")
        if decision:
            lines.append(f"last {role} decision at {decision.get('time', '?')}: "
                         f"{decision.get('message', '')}")
    replicas = state.get("replicas", []) if is_running else []
    if replicas:
        lines += [
            "",
            f"{'NAME':<12} {'ROLE':<8} {'STATE':<9} {'ADDRESS':<24} {'RESTARTS':>8}  LAST EXIT",
        ]
    for rep in replicas:
        exit_code = rep.get("last_exit_code")
        lines.append(
            f"{rep['name']:<12} {rep['role']:<8} {rep['state']:<9} {rep['address']:<24} "
            f"{rep.get('num_restarts', 0):>8}  {'' if exit_code is None else exit_code}"
        )
        if rep.get("last_error") and rep.get("state") != "ready":
            lines.append(f"{'':<12} why: {rep['last_error']}")
    events = state.get("events", [])[-10:]
    if events:
        lines += ["", "recent events:"]
        lines += [f"  {ev['time']}  {ev['message']}" for ev in events]
    return lines
