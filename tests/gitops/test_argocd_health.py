"""The Argo CD health check for InferencePools, run by a real Lua 5.1 against status
fixtures; the copy in the argocd-cm example is the same script. Skipped without lua5.1
(`.ci/run` installs Debian's)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "gitops" / "argocd" / "inferencepool-health.lua"
LUA = shutil.which("lua5.1")


def lua_literal(value) -> str:
    """A Python value as a Lua table constructor (what Argo CD hands the script as `obj`)."""
    if isinstance(value, dict):
        return "{" + ", ".join(f"[{lua_literal(k)}] = {lua_literal(v)}"
                               for k, v in value.items()) + "}"  # fmt: skip
    if isinstance(value, list):
        return "{" + ", ".join(lua_literal(v) for v in value) + "}"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    text = str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{text}"'


def health(obj) -> tuple[str, str]:
    assert LUA is not None
    harness = (f"obj = {lua_literal(obj)}\nlocal hs = dofile({lua_literal(str(SCRIPT))})\n"
               'io.write(hs.status, "\\t", hs.message or "")')  # fmt: skip
    out = subprocess.run([LUA, "-"], input=harness, capture_output=True, text=True, timeout=10)
    assert out.returncode == 0, out.stderr
    status, _, message = out.stdout.partition("\t")
    return status, message


def pool(generation=3, observed=3, **conditions):
    status = {"observedGeneration": observed, "conditions": [
        {"type": t, "status": s, "reason": r, "message": m}
        for t, (s, r, m) in conditions.items()]}  # fmt: skip
    return {"apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": "chat", "generation": generation}, "status": status}


READY = ("True", "AllReplicasReady", "all replicas ready")
NOT_READY = ("False", "ReplicasNotReady", "ready/desired: unified 1/3")
PROGRESSING = ("True", "ScalingUp", "starting replicas: unified")
SETTLED = ("False", "Reconciled", "desired state reached")
FINE = ("False", "AsExpected", "")


BASIC_CASES = [
    (pool(Ready=READY, Progressing=SETTLED, Degraded=FINE), "Healthy", "AllReplicasReady"),
    (pool(Ready=NOT_READY, Progressing=PROGRESSING, Degraded=FINE), "Progressing", "1/3"),
    (pool(Ready=NOT_READY, Progressing=PROGRESSING,
          Degraded=("True", "ReplicaFailed", "restarting unified-0: exited with 2")),
     "Degraded", "ReplicaFailed: restarting unified-0"),
    (pool(Ready=READY, Progressing=SETTLED, Degraded=FINE,
          ScalingLimited=("True", "AtMaxReplicas", "unified: at max")),
     "Healthy", "scaling limited: AtMaxReplicas"),
    (pool(generation=4, observed=3, Ready=READY, Progressing=SETTLED, Degraded=FINE),
     "Progressing", "observe generation 4"),  # stale status is not health
    (pool(Ready=NOT_READY, Progressing=SETTLED, Degraded=FINE), "Degraded", "stalled"),
    ({"metadata": {"name": "new", "generation": 1}}, "Progressing", "report status"),
    (pool(), "Progressing", "waiting for the Ready condition"),
    (pool(Ready=("True", "ScaledToZero", "no replicas; the router holds requests"),
          Progressing=SETTLED, Degraded=FINE), "Healthy", "ScaledToZero"),
]  # fmt: skip


@pytest.mark.skipif(LUA is None, reason="Debian's lua5.1 is not installed")
@pytest.mark.parametrize("obj,status,fragment", BASIC_CASES)
def test_health_of_status_fixtures(obj, status, fragment):
    got, message = health(obj)
    assert got == status, message
    assert fragment in message


def test_the_argocd_cm_example_embeds_the_same_script():
    cm = yaml.safe_load((ROOT / "gitops" / "argocd" / "argocd-cm.yaml").read_text())
    key = "resource.customizations.health.kvfleet.io_InferencePool"
    assert cm["data"][key] == SCRIPT.read_text()


def test_the_flux_example_health_checks_inferencepools():
    doc = yaml.safe_load((ROOT / "gitops" / "flux" / "kustomization.yaml").read_text())
    checks = doc["spec"]["healthChecks"]
    assert checks and all(c["apiVersion"] == "kvfleet.io/v1alpha1" and
                          c["kind"] == "InferencePool" for c in checks)  # fmt: skip


# -- rollouts (issue 30): statuses as api/status.py writes them (PoolStatus.to_dict) --------


def rollout_pool(phase, *, progressing, degraded=("False", "AsExpected", ""), strategy="canary",
                 step=2, num_steps=3, weight=25, canary="abcdef0123", with_rollout=True):
    import datetime

    from kvfleet_operator import api
    from kvfleet_operator.api.status import RolloutStatus

    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    status = api.PoolStatus(observed_generation=5, mode="unified")
    status.set_condition(api.ConditionType.READY, api.TRUE, api.Reason.ALL_REPLICAS_READY,
                         "all replicas ready", now)  # the stable revision keeps serving
    status.set_condition(api.ConditionType.PROGRESSING, *progressing, now)
    status.set_condition(api.ConditionType.DEGRADED, *degraded, now)
    if with_rollout:
        status.rollout = RolloutStatus(
            strategy=strategy, phase=phase, stable_revision="0123456789",
            canary_revision=canary, step=step, num_steps=num_steps, weight=weight,
            step_started_at=api.rfc3339(now), message="")
    return {"apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool",
            "metadata": {"name": "chat", "generation": 5}, "status": status.to_dict()}


IN_PROGRESS = ("True", "RolloutInProgress", "canary abcdef0123: step 2/3 at 25%")
PAUSED = ("True", "RolloutPaused", "paused at 25%")
ROLLED_BACK = ("True", "RollbackSLO",
               "rolled back abcdef0123: errorRate 0.2 > limit 0.05, stable 0.01")


ROLLOUT_CASES = [
    (rollout_pool("Progressing", progressing=IN_PROGRESS), "Progressing",
     ["canary step 2/3, 25% of new requests to revision abcdef0123",
      "RolloutInProgress: canary abcdef0123"]),
    (rollout_pool("Paused", progressing=PAUSED), "Suspended",
     ["canary step 2/3, 25% of new requests to revision abcdef0123",
      "RolloutPaused: paused at 25%"]),
    (rollout_pool("Progressing", progressing=IN_PROGRESS, strategy="blueGreen", step=1,
                  num_steps=2, weight=0),
     "Progressing", ["blueGreen step 1/2, 0% of new requests to revision abcdef0123"]),
    (rollout_pool("RolledBack", progressing=("False", "Reconciled", "desired state reached"),
                  degraded=ROLLED_BACK, step=0, num_steps=3, weight=0, canary=""),
     "Degraded", ["RollbackSLO: rolled back abcdef0123: errorRate 0.2 > limit 0.05"]),
    # A replica failing mid-rollout is Degraded, not a rollout step.
    (rollout_pool("Progressing", progressing=IN_PROGRESS,
                  degraded=("True", "ReplicaFailed", "restarting unified-1")),
     "Degraded", ["ReplicaFailed: restarting unified-1"]),
    # An operator that writes the condition but no status.rollout: the condition alone.
    (rollout_pool("Progressing", progressing=IN_PROGRESS, with_rollout=False), "Progressing",
     ["RolloutInProgress: canary abcdef0123: step 2/3 at 25%"]),
    # Done: one revision serves again.
    (rollout_pool("Stable", progressing=("False", "Reconciled", "desired state reached"),
                  step=0, num_steps=0, weight=0, canary=""), "Healthy", ["AllReplicasReady"]),
    # Other Progressing reasons with Ready True stay Healthy (scaling is not a rollout).
    (rollout_pool("Stable", progressing=("True", "ScalingUp", "starting unified-3"),
                  step=0, weight=0, canary=""), "Healthy", ["AllReplicasReady"]),
]  # fmt: skip


@pytest.mark.skipif(LUA is None, reason="Debian's lua5.1 is not installed")
@pytest.mark.parametrize("obj,status,fragments", ROLLOUT_CASES)
def test_health_during_and_after_a_rollout(obj, status, fragments):
    got, message = health(obj)
    assert got == status, message
    for fragment in fragments:
        assert fragment in message, message


# -- Flux: the Kustomization's healthCheckExprs (CEL) agree with the Argo CD script ----------

FLUX = ROOT / "gitops" / "flux" / "kustomization.yaml"
ARGO_TO_KSTATUS = {"Healthy": "Current", "Progressing": "InProgress", "Suspended": "InProgress",
                   "Degraded": "Failed"}


def flux_health(obj) -> str:
    """What kustomize-controller makes of `obj` with the example's expressions: the first of
    inProgress, failed, current that is true; an expression that cannot be evaluated (no
    status yet) leaves the resource in progress until the timeout, as Flux documents."""
    import celpy

    doc = yaml.safe_load(FLUX.read_text())
    (exprs,) = [e for e in doc["spec"]["healthCheckExprs"] if e["kind"] == "InferencePool"]
    env = celpy.Environment()
    activation = {key: celpy.json_to_cel(value) for key, value in obj.items()}
    for key, verdict in (("inProgress", "InProgress"), ("failed", "Failed"),
                         ("current", "Current")):
        try:
            result = env.program(env.compile(exprs[key])).evaluate(activation)
        except celpy.CELEvalError:
            assert "status" not in obj, f"{key} cannot be evaluated on a pool with a status"
            return "InProgress"
        if isinstance(result, celpy.CELEvalError):
            assert "status" not in obj, f"{key} cannot be evaluated on a pool with a status"
            return "InProgress"
        if result:
            return verdict
    return "InProgress"


@pytest.mark.parametrize("obj,status", [(o, s) for o, s, _ in BASIC_CASES + ROLLOUT_CASES])
def test_flux_health_check_exprs_agree_with_argo(obj, status):
    assert flux_health(obj) == ARGO_TO_KSTATUS[status]


def test_flux_health_checks_every_inferencepool_kind_it_lists():
    doc = yaml.safe_load(FLUX.read_text())
    listed = {(c["apiVersion"], c["kind"]) for c in doc["spec"]["healthChecks"]}
    exprs = {(e["apiVersion"], e["kind"]) for e in doc["spec"]["healthCheckExprs"]}
    assert listed <= exprs
