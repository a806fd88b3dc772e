"""Where the router runs (`routing.placement`), and the ports that follow from it.

- `deployment` (default): a router Deployment (`routing.replicas`) and its Service in front
  of the engine pods; engines listen on 8000.
- `sidecar`: a router container in every engine pod (a native sidecar: an init container
  with `restartPolicy: Always`, so it starts before the engine and stops after it), in
  front of its engine; the pool's Service targets the sidecars, each of which routes across
  the whole pool. Engines then listen on 8001.

Either way port 8000, named `http`, is a pod's front door (the router where there is one).
"""

from __future__ import annotations

from kvfleet_operator.api.pool import InferencePool

DEPLOYMENT = "deployment"
SIDECAR = "sidecar"
ROUTER_PORT = 8000
ENGINE_PORT = 8000
SIDECAR_ENGINE_PORT = 8001


def is_sidecar(pool: InferencePool) -> bool:
    return pool.spec.routing.placement == SIDECAR


def engine_port(pool: InferencePool) -> int:
    return SIDECAR_ENGINE_PORT if is_sidecar(pool) else ENGINE_PORT


def engine_port_name(pool: InferencePool) -> str:
    return "engine" if is_sidecar(pool) else "http"
