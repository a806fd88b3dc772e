"""vLLM pools are checked against the vLLM they run before anything starts: unknown
`engine.args` flags and CPU block sizes give UnservableSpecError (Degraded), and the
rendered args use only flags of the pinned vLLM (the list extracted from its parser)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kvfleet_operator.api import vllm_compat as vc
from kvfleet_operator.api.errors import UnservableSpecError
from kvfleet_operator.api.pool import load_pool, parse_pool
from kvfleet_operator.decide import engine_args as ea
from kvfleet_operator.decide.reconcile import invalid_spec_status

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("vllm-*.yaml"))
FLAGS = vc.known_flags(vc.VLLM_VERSION)


def _pool(engine: dict, topology: dict | None = None) -> dict:
    return {
        "apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "ns"},
        "spec": {"model": {"name": "m", "source": "hf://org/m"},
                 "engine": {"kind": "vllm", **engine},
                 "topology": topology or {"unified": {"replicas": {"min": 1, "max": 2}}}},
    }  # fmt: skip


def test_flag_list_is_the_pinned_version():
    data = json.loads((ROOT / "operator/kvfleet_operator/api/vllm_flags.json").read_text())
    assert data["version"] == vc.VLLM_VERSION
    assert vc.VLLM_IMAGE == f"vllm/vllm-openai:v{vc.VLLM_VERSION}"
    assert FLAGS is not None and "--disable-log-requests" not in FLAGS
    assert FLAGS["--block-size"] is True and FLAGS["--enforce-eager"] is False


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_pin_the_tested_vllm_and_render_known_flags(path):
    pool = load_pool(path)
    assert vc.image_version(pool.spec.engine.image) == vc.VLLM_VERSION
    assert FLAGS is not None
    for role in pool.spec.topology.roles():
        args = ea.engine_args(pool.spec, role)
        assert vc.unknown_flags(args, FLAGS) == [], role


def test_unknown_user_flag_is_unservable_and_named():
    with pytest.raises(UnservableSpecError) as err:
        parse_pool(_pool({"image": "vllm/vllm-openai:v0.32.0",
                          "args": ["--enforce-eager", "--disable-log-requests"]}))
    assert err.value.path == "spec.engine.args"
    assert "--disable-log-requests" in err.value.message
    assert "--enforce-eager" not in err.value.message


def test_unknown_flag_gives_degraded_status():
    from datetime import UTC, datetime

    from kvfleet_operator.api.status import PoolStatus

    with pytest.raises(UnservableSpecError) as err:
        parse_pool(_pool({"args": ["--no-such-flag=1"]}))  # default image: pinned version
    status = invalid_spec_status(PoolStatus(), err.value, datetime(2026, 1, 1, tzinfo=UTC))
    degraded = [c for c in status.conditions if c.type == "Degraded"]
    assert degraded and degraded[0].status == "True" and "--no-such-flag" in degraded[0].message


@pytest.mark.parametrize("image", ["vllm/vllm-openai:v0.8.5", "vllm/vllm-openai:latest",
                                   "my.registry/custom:1.0", "vllm/vllm-openai@sha256:abc"])
def test_unknown_version_is_not_checked(image):
    parse_pool(_pool({"image": image, "args": ["--disable-log-requests"]}))


@pytest.mark.parametrize(("args", "bad"), [
    (["--seed", "7", "--enforce-eager"], []),
    (["--max_num_seqs=8", "--compilation-config.mode", "0", "-O3", "-tp", "2"], []),
    (["--seed", "-1", "--kv-events-config", '{"a": 1}'], []),
    (["--disable-log-requests", "--seed", "1", "--bogus"], ["--disable-log-requests", "--bogus"]),
])  # fmt: skip
def test_unknown_flags_reads_values_and_aliases(args, bad):
    assert FLAGS is not None
    assert vc.unknown_flags(args, FLAGS) == bad


def test_cpu_image_needs_block_size_multiple_of_32():
    with pytest.raises(UnservableSpecError) as err:
        parse_pool(_pool({"image": "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0",
                          "blockSize": 16}))
    assert err.value.path == "spec.engine.blockSize" and "multiple of 32" in err.value.message
    parse_pool(_pool({"image": "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0",
                      "blockSize": 128}))
    parse_pool(_pool({"blockSize": 16}))  # a GPU image: 16 is fine


def test_runtime_that_knows_the_device_checks_block_size():
    spec = parse_pool(_pool({"blockSize": 16})).spec
    with pytest.raises(UnservableSpecError):
        vc.check_vllm_engine(spec.engine, device="cpu")
    vc.check_vllm_engine(spec.engine, device="cuda")


def test_local_command_is_the_module_entry_point(monkeypatch):
    spec = parse_pool(_pool({})).spec
    monkeypatch.setenv(ea.VLLM_PYTHON_ENV, "/opt/vllm/bin/python")
    assert ea.engine_command(spec) == [
        "/opt/vllm/bin/python", "-m", "vllm.entrypoints.openai.api_server"]


def test_precise_routing_renders_kv_events_config():
    spec = parse_pool(_pool({})).spec
    assert spec.routing.prefix_mode == "approximate"  # the default
    assert "--kv-events-config" not in ea.engine_args(spec, "unified", port=9000)
    precise = _pool({})
    precise["spec"]["routing"] = {"prefixMode": "precise"}
    spec = parse_pool(precise).spec
    args = ea.engine_args(spec, "unified", port=9000)
    cfg = json.loads(args[args.index("--kv-events-config") + 1])
    assert cfg == {"enable_kv_cache_events": True, "publisher": "zmq",
                   "endpoint": "tcp://*:9001", "replay_endpoint": "tcp://*:9002"}
    assert FLAGS is not None and vc.unknown_flags(args, FLAGS) == []


def test_the_router_config_and_the_network_policy_follow_the_prefix_mode():
    from kvfleet_operator.decide.router_config import RouterEndpoint, build_router_config
    from kvfleet_operator.runtimes.kubernetes.build.network_policy import build_network_policy
    from kvfleet_operator.runtimes.kubernetes.build.options import BuildOptions

    for mode, router_ports in (("approximate", [8000]), ("precise", [8000, 8001, 8002])):
        body = _pool({})
        body["spec"]["routing"] = {"prefixMode": mode}
        body["metadata"]["uid"] = "uid-1"  # owner references need one
        pool = parse_pool(body)
        endpoint = RouterEndpoint(name="r0", url="http://10.0.0.1:8000", role="unified")
        config = build_router_config(pool.spec, [endpoint], 1)
        assert [e["prefix_mode"] for e in config["endpoints"]] == [mode]
        policy = build_network_policy(pool, BuildOptions())
        front = policy["spec"]["ingress"][0]
        assert [p["port"] for p in front["ports"]] == router_ports
