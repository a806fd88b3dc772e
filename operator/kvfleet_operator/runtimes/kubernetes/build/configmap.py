"""The router's bootstrap config: policy, weights, session header, P/D threshold, and no
endpoints (version 0), and with several router processes the exchange through
`<pool>-router-peers` (so a router shares from its start). The operator's first push
(version 1) brings the ready pods."""

from __future__ import annotations

from typing import Any

import yaml

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.decide.router_config import build_router_config
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.service import router_peers_dns

ROUTER_CONFIG_KEY = "router.yaml"
BOOTSTRAP_VERSION = 0
# libyaml's emitter writes the same text ~3x faster; every reconcile of every pool builds this.
DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def build_router_configmap(pool: InferencePool) -> dict[str, Any]:
    config = build_router_config(pool.spec, [], BOOTSTRAP_VERSION,
                                 peers_dns=router_peers_dns(pool))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta.object_meta(pool, meta.router_config_name(pool), meta.ROUTER_APP,
                                     meta.ROUTER, meta.ROUTER),
        "data": {ROUTER_CONFIG_KEY: yaml.dump(config, Dumper=DUMPER, sort_keys=True)},
    }
