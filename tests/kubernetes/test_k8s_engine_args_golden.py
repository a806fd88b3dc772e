"""Golden command lines inside the built engine Deployments: exactly what `engine_args.py`
renders (host 0.0.0.0, port 8000), and the env it renders, unchanged."""

from __future__ import annotations

import pytest
from k8s_pools import TOKENS, all_pools, children, deployment, engine_container
from kvfleet_engine.cli import build_parser
from kvfleet_operator.decide.engine_args import engine_args, engine_env
from kvfleet_operator.runtimes.kubernetes import KVFLEET_IMAGE, VLLM_IMAGE, build_children
from kvfleet_operator.runtimes.kubernetes.build.lmcache_server import lmcache_remote_url
from kvfleet_operator.runtimes.kubernetes.build.placement import engine_port

POOLS = all_pools()
KV_BOTH = '{"kv_connector": "NixlConnector", "kv_role": "kv_both"}'

VLLM_UNIFIED = [
    "--model", "meta-llama/Meta-Llama-3-8B-Instruct", "--served-model-name", "llama3-8b",
    "--host", "0.0.0.0", "--port", "8000", "--max-num-seqs", "256",
    "--max-num-batched-tokens", "8192", "--block-size", "16",
    "--gpu-memory-utilization", "0.9", "--enable-prefix-caching", "--max-model-len", "8192",
    "--disable-uvicorn-access-log",
]  # fmt: skip
VLLM_PD = [
    "--model", "/models/meta-llama/Meta-Llama-3-70B-Instruct",
    "--served-model-name", "llama3-70b", "--host", "0.0.0.0", "--port", "8000",
    "--max-num-seqs", "256", "--max-num-batched-tokens", "16384", "--block-size", "16",
    "--gpu-memory-utilization", "0.92", "--enable-prefix-caching", "--max-model-len", "16384",
    "--tensor-parallel-size", "4", "--kv-transfer-config", KV_BOTH,
]  # fmt: skip
BUILTIN_CPU = [
    "--model", "smollm2-135m", "--served-model-name", "smollm2", "--runner", "torch",
    "--role", "unified", "--host", "0.0.0.0", "--port", "8000", "--max-num-seqs", "8",
    "--max-num-batched-tokens", "512", "--block-size", "16", "--drain-timeout", "30",
    "--max-queue", "16", "--num-blocks", "512", "--max-model-len", "2048",
]  # fmt: skip
BUILTIN_PD_PREFILL = [
    "--model", "llama3-8b-sim", "--served-model-name", "llama3-8b", "--runner", "simulated",
    "--role", "prefill", "--host", "0.0.0.0", "--port", "8000", "--max-num-seqs", "128",
    "--max-num-batched-tokens", "4096", "--block-size", "16", "--drain-timeout", "15",
    "--max-queue", "256", "--profile", "h100-llama3-8b", "--num-blocks", "8192",
    "--max-model-len", "8192",
]  # fmt: skip


def _env_values(container):
    return {e["name"]: e["value"] for e in container["env"] if "value" in e}


def test_vllm_unified_golden():
    c = engine_container(children(POOLS["vllm-unified"]), "llama3-8b-unified")
    assert "command" not in c  # the vllm-openai image's entrypoint (vllm serve)
    assert c["image"] == "vllm/vllm-openai:v0.32.0"
    assert c["args"] == VLLM_UNIFIED


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_vllm_pd_golden(role):
    objs = children(POOLS["vllm-disaggregated"])
    c = engine_container(objs, f"llama3-70b-pd-{role}")
    assert c["args"] == VLLM_PD
    env = _env_values(c)
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5600"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "$(POD_IP)"
    assert {"name": "nixl", "containerPort": 5600, "protocol": "TCP"} in c["ports"]


def test_builtin_goldens_and_they_parse_with_the_engines_own_parser():
    c = engine_container(children(POOLS["local-cpu"]), "local-cpu-unified")
    assert c["command"] == ["kvfleet", "engine"] and c["image"] == KVFLEET_IMAGE
    assert c["args"] == BUILTIN_CPU
    pd = engine_container(children(POOLS["builtin-pd"]), "sim-pd-prefill")
    assert pd["args"] == BUILTIN_PD_PREFILL
    for args in (c["args"], pd["args"]):
        parsed = build_parser().parse_args(args)
        assert (parsed.host, parsed.port) == ("0.0.0.0", 8000)


@pytest.mark.parametrize("name", sorted(POOLS))
def test_every_engine_runs_exactly_what_engine_args_renders(name):
    pool = POOLS[name]
    objs = children(pool)
    for role in pool.spec.topology.roles():
        c = engine_container(objs, f"{pool.name}-{role}")
        port = 8001 if pool.spec.routing.placement == "sidecar" else 8000
        assert engine_port(pool) == port
        lmcache = lmcache_remote_url(pool)  # routing.kvSharing on vLLM (test_k8s_lmcache.py)
        assert c["args"] == engine_args(pool.spec, role, host="0.0.0.0", port=port,
                                        lmcache_url=lmcache)
        env = _env_values(c)
        for key, value in engine_env(pool.spec, role, lmcache_url=lmcache).items():
            assert env[key] == value
        assert [e["name"] for e in c["env"]].count("HOME") == 1


def test_images_default_and_override():
    pool = all_pools()["vllm-unified"]
    pool.spec.engine.image = None
    c = engine_container(children(pool), "llama3-8b-unified")
    assert c["image"] == VLLM_IMAGE
    objs = build_children(POOLS["local-cpu"], tokens=TOKENS, image="registry.local/kv:dev")
    assert engine_container(objs, "local-cpu-unified")["image"] == "registry.local/kv:dev"
    router = deployment(objs, "local-cpu-router")["spec"]["template"]["spec"]["containers"][0]
    assert router["image"] == "registry.local/kv:dev"


def test_the_default_image_is_this_release():
    from importlib.metadata import version

    assert KVFLEET_IMAGE == f"ghcr.io/kvfleet/kvfleet:{version('kvfleet')}"
