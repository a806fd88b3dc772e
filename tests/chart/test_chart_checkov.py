"""checkov (the IaC scanner) finds zero failed checks on the rendered chart (every values
set, and the CRDs) and on the operator's children of every example pool (`kvfleet operator
render`), with the skips below, each justified next to it. A skip that no longer fires is
an error too, so the list cannot go stale.

checkov's dependencies clash with the project's, so it lives in its own venv,
.venv-checkov (`make checkov`, which `make test` runs); without it this module is skipped
with one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from chart_render import CHART, EXAMPLE_POOLS, ROOT, VALUE_SETS, render_raw

CHECKOV = Path(os.environ.get("KVFLEET_CHECKOV", ROOT / ".venv-checkov" / "bin" / "checkov"))
if not CHECKOV.exists():
    pytest.skip(f"checkov is not installed at {CHECKOV} (make checkov creates it)",
                allow_module_level=True)  # fmt: skip

# The chart: the operator's Deployment, RBAC, Services, monitors.
CHART_SKIPS = {
    # Image digest: no kvfleet image is published yet, so the default cannot name a digest.
    # `image.digest` pins one (ci/observability-values.yaml does, and passes this check).
    "CKV_K8S_43": "image pinned by release tag by default; image.digest pins a digest",
    # Pull policy Always: the default image is an immutable release tag (or a digest), and
    # `IfNotPresent` is what lets kind (e2e/kind.sh) run images loaded with `kind load`.
    # `image.pullPolicy` sets Always where wanted.
    "CKV_K8S_15": "immutable tags or digests; kind-loaded images need IfNotPresent",
    # Service account token mounted: the operator is the one pod that must call the API
    # server (kopf watches, server-side apply); every engine and router pod has it off.
    "CKV_K8S_38": "the operator talks to the API server with this token",
    # High UID (>= 10000): kvfleet runs every pod as the fixed uid 1000 that its image
    # (images/Dockerfile, ARG UID=1000) and the operator's builders (security.py,
    # RUN_AS_UID) use. With no hostPath, host namespace or privileged pod anywhere (the Pod
    # Security "restricted" checks in tests/kubernetes), the uid never meets a host file.
    "CKV_K8S_40": "fixed uid 1000 shared with the image and the builders; no host access",
    # "Can read all secrets": the Role that lets the operator read and write its pools'
    # token Secrets (get, create, patch; no list or watch) in each pool namespace. Secret
    # names are per pool, so resourceNames cannot narrow it; it is never cluster-wide
    # (test_chart_rbac checks that).
    "CKV2_K8S_5": "namespaced Role for the pools' token Secrets, never cluster-wide",
}

# The operator's children of each example pool: Secrets, ConfigMap, NetworkPolicy,
# Services, PDBs, engine and router Deployments.
POOL_SKIPS = {
    # Image digest: the builtin engine and router default to kvfleet's release tag (not
    # published yet), vLLM to its release tag; `engine.image` and `--image` take digests.
    "CKV_K8S_43": "release tags by default; engine.image / --image accept digests",
    # Pull policy Always: immutable release tags; kind-loaded images need IfNotPresent.
    "CKV_K8S_15": "immutable tags; kind-loaded images need IfNotPresent",
    # High UID: the fixed uid 1000 of kvfleet's image and builders (see CHART_SKIPS).
    "CKV_K8S_40": "fixed uid 1000 shared with the image; no host access",
    # CPU limits: CFS quotas throttle the engines' step loops and the routers' event loops
    # in bursts, which shows up as TTFT/ITL tail latency. Pools request CPU (the scheduler
    # reserves it) and set memory limits; a pool may still set cpu limits in `resources`.
    "CKV_K8S_11": "CPU limits throttle latency-critical loops; requests are set",
    # Secrets as env: KVFLEET_ENGINE_TOKEN (the engines' KV-events/transfer token) reaches
    # the router and builtin engines by `secretKeyRef`, never as a literal; the engine and
    # router read it only from the environment (the router's admin token is a file).
    "CKV_K8S_35": "engine token via secretKeyRef; the engine reads it only from env",
    # Pods without a NetworkPolicy: the router pods are the pool's front door (the OpenAI
    # API on their only port, 8000, for every client); a policy would admit everyone on
    # it. The engines, behind them, have a NetworkPolicy of their own.
    "CKV2_K8S_6": "routers are the public front door on their only port",
}


def _checkov(directory: Path, skips: dict[str, str] | None) -> dict:
    cmd = [str(CHECKOV), "--directory", str(directory), "--framework", "kubernetes",
           "--output", "json", "--skip-download", "--no-fail-on-crash"]  # fmt: skip
    if skips:
        cmd += ["--skip-check", ",".join(sorted(skips))]
    env = {**os.environ, "LOG_LEVEL": "ERROR", "BC_SKIP_MAPPING": "TRUE"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]
    report = json.loads(proc.stdout)
    [result] = report if isinstance(report, list) else [report]
    assert result["check_type"] == "kubernetes"
    result["returncode"] = proc.returncode
    return result


def _failed(result: dict) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for check in result["results"]["failed_checks"]:
        out.setdefault(check["check_id"], []).append(f"{check['file_path']} {check['resource']}")
    return out


@pytest.fixture(scope="module")
def scanned(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("checkov")
    chart = root / "chart"
    for name, values in VALUE_SETS.items():
        target = chart / name
        target.mkdir(parents=True)
        for path, text in render_raw(values).items():
            if path.endswith(".yaml") and text.strip():
                (target / Path(path).name).write_text(text)
    (chart / "crds").mkdir()
    for crd in (CHART / "crds").glob("*.yaml"):
        (chart / "crds" / crd.name).write_bytes(crd.read_bytes())
    pools = root / "pools"
    pools.mkdir()
    for path in EXAMPLE_POOLS:
        cmd = [sys.executable, "-m", "kvfleet_operator.cli.main", "operator", "render", str(path)]
        if not yaml.safe_load(path.read_text())["metadata"].get("namespace"):
            # A pool without a namespace lands where it is applied; render it into one
            # rather than `default` (CKV_K8S_21 stays on for the pools that name theirs).
            cmd += ["--namespace", "inference"]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        (pools / path.name).write_text(proc.stdout)
    return {"chart": chart, "pools": pools}


def test_the_chart_has_zero_failed_checks(scanned):
    result = _checkov(scanned["chart"], CHART_SKIPS)
    assert _failed(result) == {}
    assert result["returncode"] == 0
    summary = result["summary"]
    assert summary["failed"] == 0 and summary["parsing_errors"] == 0
    assert summary["passed"] > 100 and summary["resource_count"] >= 30


def test_the_pools_children_have_zero_failed_checks(scanned):
    result = _checkov(scanned["pools"], POOL_SKIPS)
    assert _failed(result) == {}
    assert result["returncode"] == 0
    summary = result["summary"]
    assert summary["failed"] == 0 and summary["parsing_errors"] == 0
    deployments = sum(
        text.count("\nkind: Deployment") + text.startswith("kind: Deployment")
        for text in (p.read_text() for p in scanned["pools"].glob("*.yaml"))
    )
    assert deployments >= 8 and summary["passed"] > 100


@pytest.mark.parametrize("target,skips", [("chart", CHART_SKIPS), ("pools", POOL_SKIPS)])
def test_every_skip_still_fires_and_nothing_else_does(scanned, target, skips):
    failed = _failed(_checkov(scanned[target], None))
    assert set(failed) == set(skips), {k: v[:3] for k, v in failed.items() if k not in skips}
