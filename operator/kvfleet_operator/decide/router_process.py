"""How many router processes a pool runs, pure: the router container's resources, its
workers (`kvfleet router --workers N`) and the pool's count of router processes.

Public API:

- `ROUTER_RESOURCES`: the router container's resources when `routing.resources` is unset.
- `router_resources(spec) -> dict`: `routing.resources` over those defaults, one resource
  name at a time: a resource the pool names (as a request or a limit) takes none of the
  defaults for it, so a pool's own limit never sits under a default request.
- `cpu_cores(quantity) -> Fraction`: a Kubernetes CPU quantity in cores (`1999m` -> 1.999).
- `router_cpu_request(spec) -> Fraction | None`: the CPU a router container is guaranteed
  (its request; Kubernetes takes the limit where only a limit is set).
- `router_workers(spec) -> int`: `routing.workers`, or unset one per whole core of that
  request (at least 1, at most `MAX_DERIVED_WORKERS`): one Python process routes on one
  core, so a pod given 2 cores runs 2 workers, a pod given 1.999 runs 1.
- `router_processes(spec) -> int`: router processes that route the pool's engines, all
  pods together: `routing.replicas` pods of `router_workers` each, plus with
  `routing.gateway` the `routing.replicas` endpoint pickers (one process each: the picker's
  gRPC port takes no second worker). Sidecar routers are not counted (`routing.placement:
  sidecar` runs one per engine pod, a number the spec does not fix).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from kvfleet_operator.api.spec import PoolSpec

ROUTER_RESOURCES: dict[str, dict[str, str]] = {
    "requests": {"cpu": "500m", "memory": "512Mi"},
    "limits": {"memory": "2Gi"},
}
# Unset workers follow the CPU request up to here: past 8 processes one pod's exchange
# fan-out and config relay grow for little, and more replicas spread better anyway.
MAX_DERIVED_WORKERS = 8

_SUFFIX = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30), "Ti": Fraction(2**40),
    "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}
_QUANTITY = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))"
                       r"(?:([eE][+-]?[0-9]+)|(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])?)$")


def cpu_cores(quantity: str | int) -> Fraction:
    """A quantity as an exact number (no float rounding: `1999m` is 1.999, never 2)."""
    match = _QUANTITY.fullmatch(str(quantity))
    if match is None:
        raise ValueError(f"{quantity!r} is not a Kubernetes quantity (e.g. 2, 1500m)")
    number, exponent, suffix = match.groups()
    value = Fraction(number)
    if exponent is not None:
        return value * Fraction(10) ** int(exponent[1:])
    return value * _SUFFIX[suffix or ""]


def router_resources(spec: PoolSpec) -> dict[str, dict[str, str]]:
    own = spec.routing.resources
    requests = dict(own.requests or {}) if own is not None else {}
    limits = dict(own.limits or {}) if own is not None else {}
    named = set(requests) | set(limits)
    out: dict[str, dict[str, str]] = {}
    for kind, given in (("requests", requests), ("limits", limits)):
        merged = {k: v for k, v in ROUTER_RESOURCES[kind].items() if k not in named}
        merged.update(given)
        if merged:
            out[kind] = dict(sorted(merged.items()))
    return out


def router_cpu_request(spec: PoolSpec) -> Fraction | None:
    resources = router_resources(spec)
    cpu = resources.get("requests", {}).get("cpu") or resources.get("limits", {}).get("cpu")
    return cpu_cores(cpu) if cpu is not None else None


def router_workers(spec: PoolSpec) -> int:
    if spec.routing.workers is not None:
        return spec.routing.workers
    cores = router_cpu_request(spec)
    whole = math.floor(cores) if cores is not None else 1
    return min(MAX_DERIVED_WORKERS, max(1, whole))


def router_processes(spec: PoolSpec) -> int:
    r = spec.routing
    pickers = r.replicas if r.gateway is not None else 0
    return r.replicas * router_workers(spec) + pickers

