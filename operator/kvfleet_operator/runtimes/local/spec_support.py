"""What a local fleet cannot honour of a pool spec, pure: `kvfleet up` warns, one line each.

Processes on one machine have no images, no scheduler (node selectors, tolerations), no
resource limits and no GPU allocation, and `kvfleet up` runs a single router.
"""

from __future__ import annotations

from kvfleet_operator.api.spec import PoolSpec


def unhonoured_fields(spec: PoolSpec) -> list[str]:
    out = []
    if spec.engine.image:
        out.append(f"engine.image ({spec.engine.image}) is ignored: local engines run as "
                   "processes from this install")
    if spec.routing.placement != "deployment":
        out.append(f"routing.placement ({spec.routing.placement}) is ignored: a local fleet "
                   "runs one router process in front of its engines")
    if spec.routing.gateway is not None:
        out.append(f"routing.gateway ({spec.routing.gateway.kind}) is ignored: a local fleet "
                   "runs kvfleet's router, no gateway endpoint picker")
    if spec.routing.kv_sharing.enabled and spec.engine.kind == "vllm":
        out.append("routing.kvSharing is ignored for engine.kind: vllm: a local fleet runs "
                   "no LMCache server, so each vLLM engine keeps its own prefix cache")
    if spec.routing.replicas > 1:
        out.append(f"routing.replicas ({spec.routing.replicas}) is ignored: a local fleet "
                   "runs one router")
    if (router := spec.routing.resources) is not None and (router.requests or router.limits):
        out.append("routing.resources is ignored: local processes have no resource requests "
                   "or limits")
    for name, role in spec.topology.roles().items():
        where = f"topology.{name}"
        if role.resources is not None and (role.resources.requests or role.resources.limits):
            out.append(f"{where}.resources is ignored: local processes have no resource "
                       "requests or limits")
        if role.node_selector:
            out.append(f"{where}.nodeSelector is ignored: a local fleet has one node")
        if role.tolerations:
            out.append(f"{where}.tolerations is ignored: a local fleet has one node")
        if role.gpus:
            out.append(f"{where}.gpus ({role.gpus}) is ignored: local processes get no GPU "
                       "allocation")
    return out
