"""A test harness that plays the cluster's kubelet and ReplicaSet controller for kmock, with
real processes: for each Deployment the operator writes, it runs that many `kvfleet engine`
or `kvfleet router` processes, each on its own loopback address (its "pod IP") with the
container's own args, and writes Pods with those IPs, readiness and deletion back into
kmock. Secrets and ConfigMaps that a pod mounts or reads as env are taken from kmock.

On a scale-down it removes the pod with the lowest `controller.kubernetes.io/pod-deletion-cost`
(as the ReplicaSet does) and sends its process SIGTERM (as the kubelet does). A new pod
template (its `kvfleet.io/template-hash`) rolls as a Deployment with maxSurge 1 and
maxUnavailable 0 does: one new pod at a time, and an old pod goes only once a new one is
`Ready`, which with kvfleet's readiness gate `kvfleet.io/routed` means once the operator
opened it. The kubelet reports `ContainersReady` from `/health` and `Ready` from that and
the gate's condition.
"""

from __future__ import annotations

import asyncio
import base64
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from kmock_shim import KubeShim, api

DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
TEMPLATE_HASH = "kvfleet.io/template-hash"
ROUTED_GATE = "kvfleet.io/routed"
SUBNET = "127.0.77."


@dataclass
class FakePod:
    name: str
    deployment: str
    ip: str
    proc: subprocess.Popen
    template_hash: str | None = None
    is_gated: bool = False  # the template has kvfleet's readiness gate
    is_healthy: bool = False  # ContainersReady
    is_ready: bool = False  # Ready: healthy, and the gate (if any) open


@dataclass
class ProcessKubelet:
    cluster: KubeShim
    namespace: str
    workdir: Path
    pods: dict[str, FakePod] = field(default_factory=dict)
    removed: list[dict[str, Any]] = field(default_factory=list)  # pods as they were when removed
    max_replicas: dict[str, int] = field(default_factory=dict)
    _next_ip: int = 1
    _task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> ProcessKubelet:
        self._task = asyncio.create_task(self._run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for pod in self.pods.values():
            pod.proc.send_signal(signal.SIGKILL)
            pod.proc.wait(10)

    async def _run(self) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0)) as http:
            while True:
                await self.sync(http)
                await asyncio.sleep(0.2)

    # --- one pass ------------------------------------------------------------------------

    async def sync(self, http: aiohttp.ClientSession) -> None:
        for deployment in self.cluster.objs("apps/v1/deployments", self.namespace):
            name = deployment["metadata"]["name"]
            want = int(deployment["spec"]["replicas"])
            self.max_replicas[name] = max(want, self.max_replicas.get(name, 0))
            current = (deployment["spec"]["template"]["metadata"].get("annotations")
                       or {}).get(TEMPLATE_HASH)  # fmt: skip
            mine = [p for p in self.pods.values() if p.deployment == name]
            old = [p for p in mine if p.template_hash != current]
            new = [p for p in mine if p.template_hash == current]
            # maxUnavailable 0: an old pod goes only as far as Ready new pods replace it.
            while old and len(old) + len([p for p in new if p.is_ready]) > want:
                victim = self._victim(old)
                old.remove(victim)
                await self._remove(victim)
            while not old and len(new) > want:
                victim = self._victim(new)
                new.remove(victim)
                await self._remove(victim)
            surge = 1 if old else 0  # maxSurge 1, one new pod at a time while rolling
            for _ in range(min(want + surge - len(old) - len(new), 1 if old else want)):
                await self._start(deployment)
        for pod in list(self.pods.values()):
            if pod.proc.poll() is not None:  # exited on its own: gone (a test would notice)
                await self._forget(pod)
                continue
            if not pod.is_healthy:
                pod.is_healthy = await self._is_healthy(http, pod)
            await self._report(pod)

    async def _report(self, pod: FakePod) -> None:
        """Write ContainersReady and Ready (the gate's condition as the operator set it)."""
        found = self.cluster.obj("v1/pods", self.namespace, pod.name) or {}
        conditions = (found.get("status") or {}).get("conditions") or []
        routed = any(c.get("type") == ROUTED_GATE and c.get("status") == "True"
                     for c in conditions)  # fmt: skip
        ready = pod.is_healthy and (routed or not pod.is_gated)
        if ready == pod.is_ready and any(c.get("type") == "ContainersReady"
                                         for c in conditions) == pod.is_healthy:
            return
        pod.is_ready = ready
        wanted = [{"type": "ContainersReady", "status": "True"}] if pod.is_healthy else []
        wanted.append({"type": "Ready", "status": "True" if ready else "False"})
        if routed:
            wanted.append({"type": ROUTED_GATE, "status": "True"})
        await api(self.cluster, "PATCH", self._path(pod.name) + "/status",
                  {"status": {"conditions": wanted}}, "application/merge-patch+json")

    def _victim(self, pods: list[FakePod]) -> FakePod:
        def cost(pod: FakePod) -> int:
            found = self.cluster.obj("v1/pods", self.namespace, pod.name) or {}
            return int(((found.get("metadata") or {}).get("annotations") or {})
                       .get(DELETION_COST, "0"))  # fmt: skip

        return min(pods, key=cost)

    async def _remove(self, pod: FakePod) -> None:
        self.removed.append(self.cluster.obj("v1/pods", self.namespace, pod.name) or {})
        pod.proc.send_signal(signal.SIGTERM)  # the engine drains what it still holds
        await self._forget(pod)

    async def _forget(self, pod: FakePod) -> None:
        self.pods.pop(pod.name, None)
        if self.cluster.obj("v1/pods", self.namespace, pod.name) is not None:
            await api(self.cluster, "DELETE", self._path(pod.name))

    def _path(self, name: str) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{name}"

    async def _is_healthy(self, http: aiohttp.ClientSession, pod: FakePod) -> bool:
        try:
            async with http.get(f"http://{pod.ip}:8000/health") as resp:
                return resp.status == 200
        except (aiohttp.ClientError, OSError, TimeoutError):
            return False

    # --- starting a pod ------------------------------------------------------------------

    def _secret(self, name: str, key: str) -> str:
        found = self.cluster.obj("v1/secrets", self.namespace, name)
        assert found is not None, f"the pod needs Secret {name}"
        return base64.b64decode(found["data"][key]).decode()

    def _argv(self, container: dict[str, Any], ip: str, pod_dir: Path) -> list[str]:
        args = list(container.get("args") or [])
        for i, arg in enumerate(args[:-1]):
            if arg == "--host":
                args[i + 1] = ip
            elif arg == "--config":  # the ConfigMap the pod mounts
                args[i + 1] = str(self._write_config(pod_dir))
            elif arg == "--admin-token-file":
                args[i + 1] = str(self._write_admin_token(pod_dir))
        command = list(container["command"])
        assert command[0] == "kvfleet"
        return [sys.executable, "-m", "kvfleet_operator.cli.main", *command[1:], *args]

    def _write_config(self, pod_dir: Path) -> Path:
        maps = self.cluster.objs("v1/configmaps", self.namespace)
        assert len(maps) == 1
        path = pod_dir / "router.yaml"
        path.write_text(next(iter(maps[0]["data"].values())))
        return path

    def _write_admin_token(self, pod_dir: Path) -> Path:
        secret = next(s for s in self.cluster.objs("v1/secrets", self.namespace)
                      if s["metadata"]["name"].endswith("-router-admin-token"))  # fmt: skip
        path = pod_dir / "admin-token"
        path.write_text(base64.b64decode(secret["data"]["token"]).decode())
        return path

    def _env(self, container: dict[str, Any]) -> dict[str, str]:
        env = dict(os.environ)
        for item in container.get("env") or []:
            ref = (item.get("valueFrom") or {}).get("secretKeyRef")
            if ref:
                env[item["name"]] = self._secret(ref["name"], ref["key"])
            elif "value" in item and not str(item["value"]).startswith(("/cache", "/tmp")):
                env[item["name"]] = str(item["value"])
        return env

    async def _start(self, deployment: dict[str, Any]) -> None:
        template = deployment["spec"]["template"]
        containers = template["spec"]["containers"]
        container = next(c for c in containers if c["name"] in ("engine", "router"))
        ip = f"{SUBNET}{self._next_ip}"
        name = f"{deployment['metadata']['name']}-{self._next_ip:03d}"
        self._next_ip += 1
        pod_dir = self.workdir / name
        pod_dir.mkdir(parents=True)
        log = (pod_dir / "log").open("wb")
        proc = subprocess.Popen(self._argv(container, ip, pod_dir), env=self._env(container),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        annotations = dict(template["metadata"].get("annotations") or {})
        gates = template["spec"].get("readinessGates") or []
        self.pods[name] = FakePod(name, deployment["metadata"]["name"], ip, proc,
                                  template_hash=annotations.get(TEMPLATE_HASH),
                                  is_gated=any(g.get("conditionType") == ROUTED_GATE
                                               for g in gates))  # fmt: skip
        await api(self.cluster, "POST", f"/api/v1/namespaces/{self.namespace}/pods", {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": dict(template["metadata"]["labels"]),
                         "annotations": annotations},
            "spec": {"readinessGates": gates},
            "status": {"phase": "Running", "podIP": ip,
                       "conditions": [{"type": "Ready", "status": "False"}],
                       "containerStatuses": [{"name": container["name"], "restartCount": 0,
                                              "state": {"running": {}}}]},
        })  # fmt: skip
