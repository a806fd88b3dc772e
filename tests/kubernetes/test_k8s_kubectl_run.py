"""As a user would: `kubectl` (the real client) applies the CRD and a pool to kmock, and
`kvfleet operator run` (the real console command, in its own process, with a kubeconfig)
reconciles it, serves its liveness probe, follows a `kubectl apply` of a changed pool,
lets `kubectl delete` finish, and exits 0 on SIGTERM. Started wrong (a port someone holds,
no credentials), it says so in one line and exits 1 instead of retrying its startup forever.

kmock serves no OpenAPI documents, so kubectl runs with `--validate=false` (the manifests
are validated with kubernetes-validate elsewhere); the CRD is served once kubectl created
it (the shim's doing).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import sys

import aiohttp
import kopf
import pytest
import yaml
from k8s_pools import ROOT, example
from kmock_shim import Operator, eventually
from kvfleet_bench.procs import free_port
from kvfleet_operator.runtimes.kubernetes import handlers
from kvfleet_operator.runtimes.kubernetes.operator_config import OperatorConfig

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="no kubectl")
NS, NAME = "inference", "llama3-8b"


async def kubectl(env: dict[str, str], *args: str, stdin: str | None = None) -> str:
    proc = await asyncio.create_subprocess_exec(
        "kubectl", *args, env=env, stdin=subprocess.PIPE if stdin else None,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin else None), 60)
    assert proc.returncode == 0, (args, err.decode())
    return out.decode()


@pytest.fixture
def user_env(cluster, kubectl_env):
    del cluster.resources["kvfleet.io/v1alpha1/inferencepools"]  # only once the CRD is applied
    return kubectl_env


async def test_kubectl_and_kvfleet_operator_run_as_a_user_would(cluster, user_env):
    env = user_env
    await kubectl(env, "apply", "--validate=false", "-f",
                  str(ROOT / "crds" / "inferencepools.kvfleet.io.yaml"))
    await kubectl(env, "apply", "--validate=false", "-f", str(ROOT / "examples" /
                                                              "vllm-unified.yaml"))
    port, metrics_port = free_port(), free_port()
    operator = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvfleet_operator.cli.main", "operator", "run", "--all-namespaces",
        "--liveness", f"http://127.0.0.1:{port}/healthz", "--max-tick", "0.5",
        "--metrics-port", str(metrics_port), env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    def deployments_made() -> bool:
        assert operator.returncode is None, "the operator exited"  # say so now, not in 60 s
        return len(cluster.objs("apps/v1/deployments", NS)) == 2

    failure: AssertionError | None = None
    try:
        await eventually(deployments_made, 60, "the Deployments")
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/healthz") as resp:
                assert resp.status == 200

        async def ready_reason() -> str:
            return await kubectl(env, "get", f"inferencepools.kvfleet.io/{NAME}", "-n", NS, "-o",
                                 "jsonpath={.status.conditions[?(@.type==\"Ready\")].reason}")

        for _ in range(100):
            if await ready_reason():
                break
            await asyncio.sleep(0.2)
        assert await ready_reason() in ("RouterNotReady", "ReplicasNotReady")
        async with aiohttp.ClientSession() as http:  # the operator's own series, per pool
            async with http.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
                text = await resp.text()
        assert f'kvfleet_pool_replicas{{pool="{NS}/{NAME}",role="unified",state="desired"}} 2.0' \
            in text
        assert f'kvfleet_pool_condition{{pool="{NS}/{NAME}",reason="' in text

        changed = example("vllm-unified.yaml")
        changed["spec"]["engine"]["maxNumSeqs"] = 64
        await kubectl(env, "apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump(changed))

        def rolled() -> bool:
            deployment = cluster.obj("apps/v1/deployments", NS, f"{NAME}-unified")
            return "64" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]

        await eventually(rolled, 30, "the changed Deployment")
        await kubectl(env, "delete", f"inferencepools.kvfleet.io/{NAME}", "-n", NS,
                      "--wait=false")
        await eventually(lambda: cluster.obj("kvfleet.io/v1alpha1/inferencepools", NS, NAME)
                         is None, 30, "the pool gone (the operator let its finalizer go)")
    except AssertionError as error:
        failure = error
    finally:
        if operator.returncode is None:
            operator.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(operator.communicate(), 30)
    text = out.decode()
    if failure is not None:  # what the operator printed says why, the requests what it did
        sent = "\n".join(f"{r.method.value} {r.url.path_qs}" for r in cluster._requests[-30:])
        raise AssertionError(f"{failure}\n--- the operator (exit {operator.returncode}):\n"
                             f"{text[-4000:]}\n--- the last requests:\n{sent}") from failure
    assert operator.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]


@pytest.mark.parametrize("flag", ["--liveness", "--metrics-port"])
async def test_a_port_someone_else_holds_is_one_line_and_exit_1(cluster, kubectl_env, flag):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))  # noqa: S104 - the metrics server binds all addresses
        holder.listen()
        port = holder.getsockname()[1]
        value = f"http://127.0.0.1:{port}/healthz" if flag == "--liveness" else str(port)
        operator = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "kvfleet_operator.cli.main", "operator", "run", "-A",
            flag, value, env=kubectl_env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        out, err = await asyncio.wait_for(operator.communicate(), 60)
    assert operator.returncode == 1, (out + err).decode()[-3000:]
    line = err.decode().strip().splitlines()[-1]
    assert line.startswith(f"kvfleet operator run: {flag} "), err.decode()[-3000:]
    assert "in use" in line and "Traceback" not in err.decode(), err.decode()[-3000:]


async def test_a_metrics_port_taken_after_the_check_ends_kopf_instead_of_retrying(cluster):
    """The race `ports_taken` cannot close: the startup handler gives up at once (kopf
    would retry an ordinary error forever, reconciling nothing)."""
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))  # noqa: S104 - the metrics server binds all addresses
        holder.listen()
        config = OperatorConfig(max_tick_s=0.3, retry_delay_s=0.3,
                                metrics_port=holder.getsockname()[1])
        operator = await Operator(str(cluster.url), config).start()
        assert operator.task is not None
        with pytest.raises(Exception) as caught:  # kopf's ActivityError is not public
            await asyncio.wait_for(operator.task, 20)
    assert isinstance(caught.value.__cause__, kopf.PermanentError), caught.value
    assert "--metrics-port" in str(caught.value.__cause__)


RACE = """
import sys
from kvfleet_operator.cli.main import main
from kvfleet_operator.runtimes.kubernetes import run_cmd
run_cmd.ports_taken = lambda args: None  # the port is taken after the check looked
sys.argv = ["kvfleet", *sys.argv[1:]]
sys.exit(main())
"""


async def test_run_ends_in_one_line_when_a_startup_handler_gives_up(cluster, kubectl_env):
    with socket.socket() as holder:
        holder.bind(("0.0.0.0", 0))  # noqa: S104 - the metrics server binds all addresses
        holder.listen()
        operator = await asyncio.create_subprocess_exec(
            sys.executable, "-c", RACE, "operator", "run", "-A", "--metrics-port",
            str(holder.getsockname()[1]), env=kubectl_env,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        out, err = await asyncio.wait_for(operator.communicate(), 60)
    text = (out + err).decode()
    assert operator.returncode == 1, text[-3000:]
    assert err.decode().strip().splitlines()[-1].startswith(
        "kvfleet operator run: --metrics-port "), text[-3000:]


@pytest.mark.parametrize("kubeconfig", ["missing", "malformed"])
async def test_no_credentials_is_one_line_and_exit_1(tmp_path, kubeconfig):
    path = tmp_path / "kubeconfig"
    if kubeconfig == "malformed":
        path.write_text("clusters: [")
    env = {**os.environ, "KUBECONFIG": str(path), "HOME": str(tmp_path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    operator = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "kvfleet_operator.cli.main", "operator", "run", "-A", env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out, err = await asyncio.wait_for(operator.communicate(), 60)
    text = err.decode()
    assert operator.returncode == 1, (out + err).decode()[-3000:]
    assert text.count("\n") == 1 and "Traceback" not in text, text[-3000:]
    assert text.startswith("kvfleet operator run: no ") and str(path) in text, text


@pytest.mark.filterwarnings("ignore:coroutine 'authenticator' was never awaited")  # kopf's
async def test_the_startup_handler_gives_up_without_credentials(cluster, tmp_path, monkeypatch):
    """Where the check in `run` is passed by (the tests' harness, a kubeconfig removed
    since): kopf ends instead of retrying the startup every 60 s."""
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "gone"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    url = str(cluster.url).rstrip("/")
    registry = handlers.register(
        kopf.OperatorRegistry(), login=lambda **_: kopf.ConnectionInfo(server=url, insecure=True))
    task = asyncio.create_task(kopf.operator(
        registry=registry, clusterwide=True, standalone=True,
        memo=kopf.Memo(config=OperatorConfig(max_tick_s=0.3, retry_delay_s=0.3))))  # fmt: skip
    with pytest.raises(Exception) as caught:  # kopf's ActivityError is not public
        await asyncio.wait_for(task, 20)
    assert isinstance(caught.value.__cause__, kopf.PermanentError), caught.value
    assert "no Kubernetes credentials" in str(caught.value.__cause__)
