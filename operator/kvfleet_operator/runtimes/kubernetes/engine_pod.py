"""The pod template of one engine role: the container `engine_args.py` describes, made to
run on a cluster (probes, drain, GPUs, volumes, a restricted securityContext).

- vLLM: the image's own entrypoint (`vllm serve` in vllm/vllm-openai) with exactly
  `engine_args(spec, role, host="0.0.0.0", port=8000)` as args and `engine_env` in the env,
  plus the runtime's env (caches, HF token, NIXL host), and a memory-backed /dev/shm.
  vLLM does not wait for in-flight requests on SIGTERM, so a preStop hook polls its
  `/metrics` until nothing is running or waiting (or the drain timeout passes).
- builtin: `kvfleet engine` with `engine_args` from kvfleet's image. It drains on SIGTERM
  itself (`--drain-timeout`), so it has no preStop.

Either way the grace period is the drain timeout plus `GRACE_MARGIN_S`, and the operator
has already drained the pod in every router before it deletes it.
"""

from __future__ import annotations

from typing import Any

from kvfleet_engine.contract import ENGINE_TOKEN_ENV

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.api.spec import GPU_RESOURCE, RoleSpec
from kvfleet_operator.engine_args import NIXL_SIDE_CHANNEL_PORT, engine_args, engine_env

from . import meta
from .model_source import model_volumes
from .options import VLLM_IMAGE, BuildOptions
from .secret import TOKEN_KEY
from .security import cache_env, container_security_context, pod_security_context, scratch_volumes

ENGINE_PORT = 8000
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


def _probe(failure_threshold: int, period_s: int, timeout_s: int = 5) -> dict[str, Any]:
    return {"httpGet": {"path": HEALTH_PATH, "port": "http"}, "periodSeconds": period_s,
            "timeoutSeconds": timeout_s, "failureThreshold": failure_threshold}


def probes(kind: str) -> dict[str, Any]:
    startup = _probe(STARTUP_BUDGET_S[kind] // PROBE_PERIOD_S, PROBE_PERIOD_S)
    return {"startupProbe": startup, "readinessProbe": _probe(2, 5),
            "livenessProbe": _probe(6, PROBE_PERIOD_S)}


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
        {"name": k, "value": v} for k, v in engine_env(pool.spec, role).items()
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
    ports = [{"name": "http", "containerPort": ENGINE_PORT, "protocol": "TCP"}]
    container: dict[str, Any] = {"name": "engine"}
    args = engine_args(spec, role, host="0.0.0.0", port=ENGINE_PORT)
    if spec.engine.is_builtin:
        container.update(image=spec.engine.image or image, command=["kvfleet", "engine"],
                         args=args)
    else:
        container.update(image=spec.engine.image or VLLM_IMAGE, args=args)
        volumes.append({"name": "shm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}})
        mounts.append({"name": "shm", "mountPath": "/dev/shm"})
        script = vllm_prestop_script(spec.autoscaling.drain_timeout_seconds)
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
        **probes(spec.engine.kind),
    )
    return container, volumes


def engine_pod_template(
    pool: InferencePool, role: str, image: str, options: BuildOptions
) -> dict[str, Any]:
    spec = pool.spec
    role_spec = spec.topology.roles()[role]
    container, volumes = engine_container(pool, role, image, options)
    pod: dict[str, Any] = {
        "containers": [container],
        "volumes": volumes,
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": spec.autoscaling.drain_timeout_seconds + GRACE_MARGIN_S,
        "automountServiceAccountToken": False,  # engines never call the API server
        "enableServiceLinks": False,  # a Service named vllm would set VLLM_PORT and break vLLM
    }
    if options.service_account:
        pod["serviceAccountName"] = options.service_account
    if role_spec.node_selector:
        pod["nodeSelector"] = dict(role_spec.node_selector)
    if role_spec.tolerations:
        pod["tolerations"] = [_toleration(t) for t in role_spec.tolerations]
    return {
        "metadata": {
            "labels": meta.labels(pool, meta.engine_app(pool), meta.ENGINE, role),
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
