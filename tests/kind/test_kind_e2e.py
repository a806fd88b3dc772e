"""e2e/kind.sh (kvfleet on a kind cluster) and its GitHub Actions workflow.

The cluster run needs Docker and kind: where they are missing the script must skip with
one clear line, which is what runs here. Everything it relies on that can be checked
without a cluster is checked below: the pool it applies, the Helm values it sets, the load
pod it starts, and the load generator against a real engine. With a Docker daemon, kind,
kubectl and helm present, KVFLEET_E2E_KIND=1 runs the whole script.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.procs import ProcessGroup, kvfleet_argv  # noqa: E402

SCRIPT = ROOT / "e2e" / "kind.sh"
LIB = ROOT / "e2e" / "lib.sh"
LOADGEN = ROOT / "e2e" / "loadgen.py"
POOL_FILE = ROOT / "e2e" / "pools" / "kind-cpu.yaml"
WORKFLOW = ROOT / ".github" / "workflows" / "kind-e2e.yml"
CHART = ROOT / "charts" / "kvfleet"
SKIP_RC = 77
K8S_VERSION = "1.33"


def script_var(name: str) -> str:
    """A plain `NAME=value` or `NAME=${ENV:-value}` assignment of e2e/kind.sh."""
    m = re.search(rf"^{name}=(?:\$\{{\w+:-(.*)\}}|(\S+?))(?:\s+#.*)?$", SCRIPT.read_text(), re.M)
    assert m, name
    return m.group(1) or m.group(2)


def expand(text: str) -> str:
    values = {v: script_var(v) for v in ("IMAGE", "NS", "POOL", "MODEL", "OPERATOR_NS")}
    for name, value in values.items():
        text = text.replace(f"${{{name}}}", value).replace(f"${name}", value)
    return text


def docker_and_kind() -> bool:
    if not all(shutil.which(t) for t in ("docker", "kind", "kubectl", "helm")):
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=60).returncode == 0


def test_script_parses():
    for script in (SCRIPT, LIB):
        subprocess.run(["bash", "-n", str(script)], check=True)
    assert os.access(SCRIPT, os.X_OK)
    if shutil.which("shellcheck"):
        out = subprocess.run(["shellcheck", "-x", "e2e/kind.sh", "e2e/lib.sh"], cwd=ROOT,
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stdout


@pytest.mark.skipif(docker_and_kind(), reason="Docker and kind are here: the run test runs it")
def test_skips_cleanly_without_docker_or_kind():
    """Here (no Docker daemon, no kind): one SKIP line naming what is missing, exit 77."""
    out = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=120)
    assert out.returncode == SKIP_RC, out.stdout + out.stderr
    [line] = out.stdout.splitlines()
    assert line.startswith("SKIP: e2e/kind.sh needs ")
    assert "docker" in line.lower() or "kind" in line


def test_skip_message_names_a_docker_without_daemon(tmp_path):
    """A docker client whose `docker info` fails (this machine's case) reads as no daemon."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "dirname").symlink_to(shutil.which("dirname"))
    (bin_dir / "docker").write_text("#!/bin/sh\nexit 1\n")
    (bin_dir / "docker").chmod(0o755)
    out = subprocess.run([shutil.which("bash"), str(SCRIPT)], capture_output=True, text=True,
                         env={"PATH": str(bin_dir)}, timeout=30)
    assert out.returncode == SKIP_RC, out.stderr
    assert out.stdout.splitlines() == [
        "SKIP: e2e/kind.sh needs a Docker daemon (docker info failed), kind, kubectl, helm, "
        "python3 (kind runs Kubernetes in Docker)"]


def test_pool_is_valid_and_renders():
    """The pool validates against the CRD (schema and CEL) and the builders render it."""
    from kvfleet_operator.api import parse_pool
    from kvfleet_operator.runtimes.kubernetes import Tokens, build_children

    out = subprocess.run(
        [sys.executable, "-m", "kvfleet_operator.tools.crd_validate", str(POOL_FILE)],
        capture_output=True, text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    data = yaml.safe_load(POOL_FILE.read_text())
    assert data["metadata"]["name"] == script_var("POOL")
    assert data["spec"]["model"]["servedModelName"] == script_var("MODEL")
    replicas = data["spec"]["topology"]["unified"]["replicas"]
    assert (replicas["min"], replicas["max"]) == (1, 2)  # the script waits for 2, then 1
    pool = parse_pool(data)
    pool.uid = "00000000-0000-0000-0000-000000000001"
    pool.namespace = script_var("NS")
    children = build_children(pool, tokens=Tokens(admin="a", engine="e"))
    kinds = {c["kind"] for c in children}
    # The script's ownerReference and garbage-collection checks cover each of these kinds.
    assert kinds <= {"Deployment", "Service", "ConfigMap", "Secret", "PodDisruptionBudget",
                     "NetworkPolicy"}, kinds
    for child in children:
        assert child["metadata"]["labels"]["kvfleet.io/pool"] == script_var("POOL")


def load_pod() -> dict:
    text = SCRIPT.read_text()
    body = text[text.index("<<EOF\napiVersion: v1\nkind: Pod"):].split("\n", 1)[1]
    body = body[:body.index("\nEOF\n")]
    return yaml.safe_load(expand(body).replace('"$1"', "e2e-load").replace("$1", "e2e-load")
                          .replace('"$2"', '"8"'))


def test_load_pod_is_valid_and_restricted():
    pod = load_pod()
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    [container] = pod["spec"]["containers"]
    assert container["image"] == script_var("IMAGE")
    assert container["command"] == ["python", "/e2e/loadgen.py"]  # the image has no shell
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert "--url" in container["args"] and f"http://{script_var('POOL')}-router:8000" in \
        container["args"]


def helm_set_values() -> dict:
    """The `--set` values of the script's `helm upgrade --install`, as a values dict."""
    text = expand(SCRIPT.read_text())
    text = text.replace("${IMAGE%:*}", script_var("IMAGE").rsplit(":", 1)[0])
    text = text.replace("${IMAGE##*:}", script_var("IMAGE").rsplit(":", 1)[1])
    values: dict = {}
    for raw in re.findall(r'--set "?([^"\s]+)"?', text):
        key, _, value = raw.partition("=")
        parsed = ([v for v in value[1:-1].split(",")] if value.startswith("{")
                  else yaml.safe_load(value))
        node = values
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = parsed
    return values


@pytest.mark.skipif(not (CHART / "Chart.yaml").exists(), reason="charts/kvfleet is not here yet")
def test_helm_values_render():
    """The chart accepts the script's values: the operator runs the loaded image, ticks
    every 2 s, and may read the pool's token Secrets in the pool's namespace."""
    import helm_python as helm

    values = helm_set_values()
    assert values["image"]["pullPolicy"] == "IfNotPresent"
    with helm.Chart.load(CHART) as chart:
        rendered = chart.render(values, name=script_var("RELEASE"),
                                namespace=script_var("OPERATOR_NS"))
    docs = [d for path, text in rendered.items() if path.endswith(".yaml")
            for d in yaml.safe_load_all(text) if d]
    [deploy] = [d for d in docs if d["kind"] == "Deployment"]
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    assert container["image"] == script_var("IMAGE")
    assert deploy["metadata"]["namespace"] == script_var("OPERATOR_NS")
    assert deploy["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == \
        "kvfleet-operator"  # the script (and the engines' NetworkPolicy) select it so
    args = container["args"]
    assert args[args.index("--max-tick") + 1] == "2"
    assert args[args.index("--image") + 1] == script_var("IMAGE")
    secret_roles = [d for d in docs if d["kind"] == "Role"
                    and d["metadata"].get("namespace") == script_var("NS")
                    and any("secrets" in r.get("resources", []) for r in d["rules"])]
    assert secret_roles, "no Role for the pool's Secrets in the pool's namespace"


def test_loadgen_counts_served_requests(tmp_path):
    """The load generator against a real engine: stops on the stop file, every request ok."""
    stop = tmp_path / "stop"
    with ProcessGroup(tmp_path / "logs") as procs:
        engine = procs.start(kvfleet_argv("engine", "--model", "tiny-random", "--runner",
                                          "simulated", "--profile", "cpu-tiny", "--port",
                                          "{port}"))
        load = subprocess.Popen(
            [sys.executable, str(LOADGEN), "--url", engine.url, "--model", "tiny-random",
             "--concurrency", "2", "--max-tokens", "4", "--stop-file", str(stop),
             "--report-every", "0.5"], stdout=subprocess.PIPE, text=True)
        time.sleep(3)
        stop.touch()
        out, _ = load.communicate(timeout=60)
    assert load.returncode == 0
    summary = json.loads(out.rsplit("SUMMARY ", 1)[1])
    assert summary["failed"] == 0 and summary["ok"] > 0, summary
    assert "progress ok=" in out


def test_loadgen_counts_failures(tmp_path):
    """Nothing listening: every request is a failure, with its class."""
    from helpers.procs import free_port

    out = subprocess.run(
        [sys.executable, str(LOADGEN), "--url", f"http://127.0.0.1:{free_port()}", "--model",
         "m", "--concurrency", "1", "--max-seconds", "1", "--report-every", "0.2",
         "--stop-file", str(tmp_path / "stop")], capture_output=True, text=True, timeout=60)
    summary = json.loads(out.stdout.rsplit("SUMMARY ", 1)[1])
    assert summary["ok"] == 0 and summary["failed"] > 0
    assert sum(summary["errors"].values()) == summary["failed"]


def test_workflow_runs_the_script():
    wf = yaml.safe_load(WORKFLOW.read_text())
    [job] = wf["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest"
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "e2e/kind.sh" in runs
    assert "docker build -f images/Dockerfile" in runs
    assert "kind" in runs and "helm" in (runs + json.dumps(job["steps"]))


@pytest.mark.timeout(3600)
@pytest.mark.skipif(os.environ.get("KVFLEET_E2E_KIND") != "1" or not docker_and_kind(),
                    reason="the kind cluster run needs Docker, kind, kubectl, helm and "
                    "KVFLEET_E2E_KIND=1")
def test_kind_e2e_runs():
    out = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=3500)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    assert "all kind checks passed" in out.stdout
