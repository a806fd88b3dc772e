"""As a user would: `kubectl` (the real client) applies the CRD and a pool to kmock, and
`kvfleet operator run` (the real console command, in its own process, with a kubeconfig)
reconciles it, serves its liveness probe, follows a `kubectl apply` of a changed pool,
lets `kubectl delete` finish, and exits 0 on SIGTERM.

kmock serves no OpenAPI documents, so kubectl runs with `--validate=false` (the manifests
are validated with kubernetes-validate elsewhere); the CRD is served once kubectl created
it (the shim's doing).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import subprocess
import sys

import aiohttp
import pytest
import yaml
from k8s_pools import ROOT, example
from kmock_shim import eventually
from kvfleet_bench.procs import free_port

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
    try:
        await eventually(lambda: len(cluster.objs("apps/v1/deployments", NS)) == 2, 60,
                         "the Deployments")
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
    finally:
        if operator.returncode is None:
            operator.send_signal(signal.SIGTERM)
        out, _ = await asyncio.wait_for(operator.communicate(), 30)
    text = out.decode()
    assert operator.returncode == 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
