"""Pools for the Kubernetes builder tests: every example, plus variants that reach the
other model sources and a builtin prefill/decode pool."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from kvfleet_operator.api import InferencePool, parse_pool
from kvfleet_operator.runtimes.kubernetes import Tokens, build_children

ROOT = Path(__file__).parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
TOKENS = Tokens(admin="admin-token-value-1", engine="engine-token-value-2")
UID = "6f1c7a52-0d3e-4d1c-9a57-2b8c1e0f4a11"


def manifest(path: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    return data


def pool_from(data: dict[str, Any]) -> InferencePool:
    pool = parse_pool(data)
    pool.uid = UID
    return pool


def example(name: str) -> dict[str, Any]:
    return manifest(ROOT / "examples" / name)


def _variant(
    base: dict[str, Any], name: str, section: str, key: str, value: Any
) -> dict[str, Any]:
    out = copy.deepcopy(base)
    out["metadata"]["name"] = name
    out["spec"].setdefault(section, {})[key] = value
    return out


def _split(manifest: dict[str, Any], name: str) -> dict[str, Any]:
    """The same pool with its unified role as a prefill + decode pair."""
    out = copy.deepcopy(manifest)
    out["metadata"]["name"] = name
    unified = out["spec"]["topology"].pop("unified")
    out["spec"]["topology"] = {"prefill": copy.deepcopy(unified), "decode": unified}
    return out


def variants() -> dict[str, dict[str, Any]]:
    """Manifests beyond the examples: s3, gs, a builtin pvc:// model, builtin P/D, and
    router sidecars (vLLM unified, builtin P/D)."""
    unified, cpu = example("vllm-unified.yaml"), example("local-cpu.yaml")
    pd = _split(example("local-sim.yaml"), "sim-pd")
    return {
        "vllm-s3": _variant(unified, "s3-pool", "model", "source", "s3://models/llama3-8b"),
        "vllm-gs": _variant(unified, "gs-pool", "model", "source", "gs://models/llama3-8b"),
        "builtin-pvc": _variant(cpu, "gguf-pool", "model", "source",
                                "pvc://models/smollm2/model.gguf"),
        "builtin-pd": pd,
        "vllm-sidecar": _variant(unified, "side-unified", "routing", "placement", "sidecar"),
        "builtin-pd-sidecar": _variant(pd, "side-pd", "routing", "placement", "sidecar"),
        "vllm-lmcache": lmcache_pool(),
        "builtin-flow-keys": _variant(cpu, "flow-pool", "routing", "flowControl", FLOW_CONTROL),
    }


# routing.flowControl with an API-keys Secret: the router pods mount it read-only.
FLOW_CONTROL = {"tenants": [{"name": "team-a", "band": "critical", "weight": 2,
                             "quotas": {"rpm": 600}}],
                "apiKeysSecretRef": {"name": "team-keys", "key": "keys.yaml"}}


def lmcache_pool() -> dict[str, Any]:
    """vLLM unified with routing.kvSharing: LMCache's connector and an LMCache server."""
    out = _variant(example("vllm-unified.yaml"), "shared-kv", "routing", "kvSharing",
                   {"enabled": True})
    out["spec"]["engine"]["image"] = "lmcache/vllm-openai:v0.3.11"
    return out


def all_pools() -> dict[str, InferencePool]:
    pools = {p.stem: pool_from(manifest(p)) for p in EXAMPLES}
    pools.update({k: pool_from(v) for k, v in variants().items()})
    return pools


def children(pool: InferencePool) -> list[dict[str, Any]]:
    return build_children(pool, tokens=TOKENS)


def pod_specs(objs: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(o["metadata"]["name"], o["spec"]["template"]["spec"])
            for o in objs if o["kind"] == "Deployment"]


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def deployment(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    [found] = [o for o in objs if o["kind"] == "Deployment" and o["metadata"]["name"] == name]
    return found


def engine_container(objs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    container: dict[str, Any] = deployment(objs, name)["spec"]["template"]["spec"]["containers"][0]
    return container
