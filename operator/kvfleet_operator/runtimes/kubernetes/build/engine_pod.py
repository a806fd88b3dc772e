"""The pod template of one engine role: the container `engine_args.py` describes, made to
run on a cluster (probes, drain, GPUs, volumes, a restricted securityContext).

- vLLM: the image's own entrypoint (`vllm serve` in vllm/vllm-openai) with exactly
  `engine_args(spec, role, host="0.0.0.0", port=8000)` as args and `engine_env` in the env,
  plus the runtime's env (caches, HF token, NIXL host), and a memory-backed /dev/shm.
  vLLM does not wait for in-flight requests on SIGTERM, so a preStop hook polls its
  `/metrics` until nothing is running or waiting (or the drain timeout passes).
  With `routing.kvSharing`, also LMCache's connector and env, pointing at the pool's
  LMCache server (lmcache_server.py).
- builtin: `kvfleet engine` with `engine_args` from kvfleet's image. It drains on SIGTERM
  itself (`--drain-timeout`), so it has no preStop.

Either way the grace period is the drain timeout plus `GRACE_MARGIN_S`, and the operator
has already drained the pod in every router before it deletes it.

Every engine pod is labelled `kvfleet.io/revision` with `decide.rollout.revision_of` of the
spec it was built from: the loop tells revisions apart by it (canary and blue-green rollouts).
"""

from __future__ import annotations

from typing import Any

from kvfleet_engine.contract import ENGINE_TOKEN_ENV

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.api.spec import GPU_RESOURCE, RoleSpec
from kvfleet_operator.decide.engine_args import NIXL_SIDE_CHANNEL_PORT, engine_args, engine_env
from kvfleet_operator.decide.rollout import revision_of
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.lmcache_server import lmcache_remote_url
from kvfleet_operator.runtimes.kubernetes.build.model_source import model_volumes
from kvfleet_operator.runtimes.kubernetes.build.options import VLLM_IMAGE, BuildOptions
from kvfleet_operator.runtimes.kubernetes.build.placement import (
    ENGINE_PORT,
    engine_port,
    engine_port_name,
    is_sidecar,
)
from kvfleet_operator.runtimes.kubernetes.build.router_pod import (
    ROUTER_GRACE_S,
    router_container,
    router_volumes,
)
from kvfleet_operator.runtimes.kubernetes.build.secret import TOKEN_KEY
from kvfleet_operator.runtimes.kubernetes.build.security import (
    cache_env,
    container_security_context,
    pod_security_context,
    scratch_volumes,
)
from kvfleet_operator.runtimes.kubernetes.ports.pods import ROUTED_GATE

HEALTH_PATH = "/health"
GRACE_MARGIN_S = 30  # after the drain: vLLM's own shutdown, or the builtin engine's exit
PROBE_PERIOD_S = 10
STARTUP_BUDGET_S = {"vllm": 1800, "builtin": 600}  # model download + load + warm-up
SHM_SIZE = "16Gi"  # cap of the memory-backed /dev/shm (NCCL between tensor-parallel ranks)
PRESTOP_SETTLE_S = 2  # let the routers' last requests land before polling

# preStop for vLLM: wait until vllm:num_requests_running + waiting is 0, or the deadline.
_VLLM_PRESTOP = """\
import time, urllib.request
deadline = time.time() + {drain}
time.sleep({settle})
names = ("vllm:num_requests_running", "vllm:num_requests_waiting")
while time.time() < deadline:
    try:
        text = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=2).read()
    except Exception:
        break
    busy = sum(float(line.rsplit(" ", 1)[1]) for line in text.decode().splitlines()
               if line.split("{{", 1)[0].split(" ", 1)[0] in names)
    if busy == 0:
        break
    time.sleep(1)
"""


def vllm_prestop_script(
    drain_timeout_s: int, *, settle_s: float = PRESTOP_SETTLE_S, port: int = ENGINE_PORT
) -> str:
    return _VLLM_PRESTOP.format(drain=drain_timeout_s, settle=settle_s, port=port)


def _probe(port: str, failure_threshold: int, period_s: int) -> dict[str, Any]:
    return {"httpGet": {"path": HEALTH_PATH, "port": port}, "periodSeconds": period_s,
            "timeoutSeconds": 5, "failureThreshold": failure_threshold}


def probes(kind: str, port: str = "http") -> dict[str, Any]:
    startup = _probe(port, STARTUP_BUDGET_S[kind] // PROBE_PERIOD_S, PROBE_PERIOD_S)
    return {"startupProbe": startup, "readinessProbe": _probe(port, 2, 5),
            "livenessProbe": _probe(port, 6, PROBE_PERIOD_S)}


def resources(role: RoleSpec) -> dict[str, Any]:
    requests = dict(role.resources.requests or {}) if role.resources else {}
    limits = dict(role.resources.limits or {}) if role.resources else {}
    if role.gpus > 0:
        limits[GPU_RESOURCE] = str(role.gpus)
        requests[GPU_RESOURCE] = str(role.gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = dict(sorted(requests.items()))
    if limits:
        out["limits"] = dict(sorted(limits.items()))
    return out


def _env(pool: InferencePool, role: str, extra: list[dict[str, Any]]) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": k, "value": v}
        for k, v in engine_env(pool.spec, role, lmcache_url=lmcache_remote_url(pool)).items()
    ]
    env += cache_env() + extra
    if pool.spec.engine.is_builtin:  # guards its KV events and KV transfer (as `kvfleet up`)
        env.append({"name": ENGINE_TOKEN_ENV, "valueFrom": {"secretKeyRef": {
            "name": meta.engine_secret_name(pool), "key": TOKEN_KEY}}})
    elif role in ("prefill", "decode"):  # NIXL peers dial the side channel on the pod IP
        env += [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                {"name": "VLLM_NIXL_SIDE_CHANNEL_HOST", "value": "$(POD_IP)"}]
    return env


def engine_container(
    pool: InferencePool, role: str, image: str, options: BuildOptions
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The engine container and the volumes it mounts."""
    spec = pool.spec
    model = model_volumes(spec, options)
    volumes, mounts = scratch_volumes()
    volumes += model.volumes
    mounts += model.mounts
    port, port_name = engine_port(pool), engine_port_name(pool)
    ports = [{"name": port_name, "containerPort": port, "protocol": "TCP"}]
    container: dict[str, Any] = {"name": "engine"}
    args = engine_args(spec, role, host="0.0.0.0", port=port,
                       lmcache_url=lmcache_remote_url(pool))
    if spec.engine.is_builtin:
        container.update(image=spec.engine.image or image, command=["kvfleet", "engine"],
                         args=args)
    else:
        container.update(image=spec.engine.image or VLLM_IMAGE, args=args)
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
        script = vllm_prestop_script(spec.autoscaling.drain_timeout_seconds, port=port)
        container["lifecycle"] = {"preStop": {"exec": {"command": ["python3", "-c", script]}}}
        if role in ("prefill", "decode"):
            ports.append({"name": "nixl", "containerPort": NIXL_SIDE_CHANNEL_PORT,
                          "protocol": "TCP"})
    container.update(
        ports=ports,
        env=_env(pool, role, model.env),
        resources=resources(spec.topology.roles()[role]),
        volumeMounts=mounts,
        securityContext=container_security_context(),
        **probes(spec.engine.kind, port_name),
    )
    return container, volumes


def engine_pod_template(
    pool: InferencePool, role: str, image: str, options: BuildOptions
) -> dict[str, Any]:
    spec = pool.spec
    role_spec = spec.topology.roles()[role]
    container, volumes = engine_container(pool, role, image, options)
    grace_s = spec.autoscaling.drain_timeout_seconds + GRACE_MARGIN_S
    pod: dict[str, Any] = {"containers": [container]}
    if is_sidecar(pool):  # a native sidecar: up before the engine, down after it
        pod["initContainers"] = [{**router_container(pool, image), "restartPolicy": "Always"}]
        volumes += router_volumes(pool)
        grace_s += ROUTER_GRACE_S
    pod.update({
        "volumes": volumes,
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": grace_s,
        "automountServiceAccountToken": False,  # engines never call the API server
        "enableServiceLinks": False,  # a Service named vllm would set VLLM_PORT and break vLLM
        # Ready only once kvfleet routes to it (and, in a rollout, drained the pod it
        # replaces in every router): the Deployment removes old pods only after that.
        "readinessGates": [{"conditionType": ROUTED_GATE}],
    })
    if options.service_account:
        pod["serviceAccountName"] = options.service_account
    if role_spec.node_selector:
        pod["nodeSelector"] = dict(role_spec.node_selector)
    if role_spec.tolerations:
        pod["tolerations"] = [_toleration(t) for t in role_spec.tolerations]
    labels = meta.labels(pool, meta.engine_app(pool), meta.ENGINE, role)
    labels[meta.REVISION_LABEL] = revision_of(spec)  # which template: rollouts split by it
    return {
        "metadata": {
            "labels": labels,
            "annotations": {"kubectl.kubernetes.io/default-container": "engine"},
        },
        "spec": pod,
    }


def _toleration(t: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"operator": t.operator}
    for key, value in (("key", t.key), ("value", t.value), ("effect", t.effect),
                       ("tolerationSeconds", t.toleration_seconds)):
        if value is not None:
            out[key] = value
    return out
