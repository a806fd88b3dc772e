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


@pytest.mark.skipif(LUA is None, reason="Debian's lua5.1 is not installed")
@pytest.mark.parametrize("obj,status,fragment", [
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
])  # fmt: skip
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
