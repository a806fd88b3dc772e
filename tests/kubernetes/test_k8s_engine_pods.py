"""Engine pods that run: GPUs and placement from the spec, model sources, probes, drain,
rollout strategy, replicas owned by the operator."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from k8s_pools import (
    TOKENS,
    all_pools,
    by_kind,
    children,
    deployment,
    engine_container,
    example,
    pool_from,
)
from kvfleet_operator.api import SpecError
from kvfleet_operator.decide.engine_args import model_ref
from kvfleet_operator.decide.reconcile import initial_replicas
from kvfleet_operator.runtimes.kubernetes import BuildOptions, UnservableSpec, build_children
from kvfleet_operator.runtimes.kubernetes.build.engine_pod import vllm_prestop_script
from kvfleet_operator.runtimes.kubernetes.build.placement import engine_port, engine_port_name

POOLS = all_pools()


def _pod(objs, name):
    return deployment(objs, name)["spec"]["template"]["spec"]


def _mounts(container):
    return {m["mountPath"]: m for m in container["volumeMounts"]}


def _volumes(pod):
    return {v["name"]: v for v in pod["volumes"]}


def test_gpus_node_selector_tolerations_and_resources():
    objs = children(POOLS["vllm-unified"])
    pod = _pod(objs, "llama3-8b-unified")
    res = pod["containers"][0]["resources"]
    assert res["limits"] == {"memory": "48Gi", "nvidia.com/gpu": "1"}
    assert res["requests"] == {"cpu": "4", "memory": "32Gi", "nvidia.com/gpu": "1"}
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [{"operator": "Exists", "key": "nvidia.com/gpu",
                                   "effect": "NoSchedule"}]
    cpu = _pod(children(POOLS["local-cpu"]), "local-cpu-unified")
    assert "nvidia.com/gpu" not in str(cpu["containers"][0].get("resources"))
    assert "nodeSelector" not in cpu and "tolerations" not in cpu


def test_shm_only_for_vllm_and_memory_backed():
    vllm = _pod(children(POOLS["vllm-disaggregated"]), "llama3-70b-pd-decode")
    shm = _mounts(vllm["containers"][0])["/dev/shm"]
    assert _volumes(vllm)[shm["name"]]["emptyDir"]["medium"] == "Memory"
    builtin = _pod(children(POOLS["local-cpu"]), "local-cpu-unified")
    assert "/dev/shm" not in _mounts(builtin["containers"][0])


@pytest.mark.parametrize("name", sorted(POOLS))
def test_probes_grace_and_rollout(name):
    pool = POOLS[name]
    drain = pool.spec.autoscaling.drain_timeout_seconds
    for role in pool.spec.topology.roles():
        dep = deployment(children(pool), f"{pool.name}-{role}")
        assert dep["spec"]["strategy"] == {
            "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
        pod = dep["spec"]["template"]["spec"]
        c = pod["containers"][0]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"] == {"path": "/health", "port": engine_port_name(pool)}
        startup = c["startupProbe"]
        assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # model loading
        assert pod["terminationGracePeriodSeconds"] > drain
        assert dep["spec"]["progressDeadlineSeconds"] > (
            startup["periodSeconds"] * startup["failureThreshold"])
        if pool.spec.engine.kind == "vllm":
            script = c["lifecycle"]["preStop"]["exec"]["command"]
            assert script[:2] == ["python3", "-c"] and f"+ {drain}\n" in script[2]
            assert f"127.0.0.1:{engine_port(pool)}/metrics" in script[2]
        else:  # the builtin engine drains on SIGTERM for --drain-timeout
            assert "lifecycle" not in c
            assert c["args"][c["args"].index("--drain-timeout") + 1] == str(drain)


def test_replicas_default_to_where_the_pool_starts_and_follow_the_loop():
    pool = POOLS["vllm-disaggregated"]
    objs = children(pool)
    start = initial_replicas(pool.spec, pool.status)
    assert deployment(objs, "llama3-70b-pd-decode")["spec"]["replicas"] == start["decode"] == 2
    assert deployment(objs, "llama3-70b-pd-router")["spec"]["replicas"] == 2  # routing.replicas
    objs = build_children(pool, tokens=TOKENS, replicas={"decode": 7})
    assert deployment(objs, "llama3-70b-pd-decode")["spec"]["replicas"] == 7
    assert deployment(objs, "llama3-70b-pd-prefill")["spec"]["replicas"] == start["prefill"]
    with pytest.raises(UnservableSpec, match="unified"):
        build_children(pool, tokens=TOKENS, replicas={"unified": 1})


def test_headless_services_and_pdbs_per_role():
    pool = POOLS["vllm-disaggregated"]
    objs = children(pool)
    services = {s["metadata"]["name"]: s["spec"] for s in by_kind(objs, "Service")}
    assert services["llama3-70b-pd-decode"]["clusterIP"] == "None"
    assert [p["name"] for p in services["llama3-70b-pd-prefill"]["ports"]] == ["http", "nixl"]
    assert services["llama3-70b-pd-router"]["selector"]["app.kubernetes.io/component"] == "router"
    pdbs = {p["metadata"]["name"]: p["spec"] for p in by_kind(objs, "PodDisruptionBudget")}
    assert set(pdbs) == {"llama3-70b-pd-prefill", "llama3-70b-pd-decode", "llama3-70b-pd-router"}
    assert pdbs["llama3-70b-pd-decode"]["maxUnavailable"] == 1
    assert pdbs["llama3-70b-pd-decode"]["selector"]["matchLabels"]["kvfleet.io/role"] == "decode"


# --- model sources ---


def test_hf_source_cache_is_an_empty_dir_and_token_only_when_given():
    pool = POOLS["vllm-unified"]
    pod = _pod(children(pool), "llama3-8b-unified")
    c = pod["containers"][0]
    cache = _mounts(c)["/hf-cache"]
    assert _volumes(pod)[cache["name"]] == {"name": "hf-cache", "emptyDir": {}}
    env = {e["name"]: e for e in c["env"]}
    assert env["HF_HOME"]["value"] == "/hf-cache" and "HF_TOKEN" not in env
    options = BuildOptions(hf_token_secret="hf", hf_cache_claim="hf-models")
    pod = _pod(build_children(pool, tokens=TOKENS, options=options), "llama3-8b-unified")
    env = {e["name"]: e for e in pod["containers"][0]["env"]}
    assert env["HF_TOKEN"]["valueFrom"] == {"secretKeyRef": {"name": "hf", "key": "token"}}
    assert _volumes(pod)["hf-cache"]["persistentVolumeClaim"] == {"claimName": "hf-models"}


@pytest.mark.parametrize("name", ["vllm-disaggregated", "builtin-pvc"])
def test_pvc_source_is_mounted_read_only_where_model_ref_points(name):
    pool = POOLS[name]
    role = next(iter(pool.spec.topology.roles()))
    pod = _pod(children(pool), f"{pool.name}-{role}")
    c = pod["containers"][0]
    ref = model_ref(pool.spec)
    assert c["args"][c["args"].index("--model") + 1] == ref
    [mount] = [m for m in c["volumeMounts"] if ref.startswith(m["mountPath"] + "/")]
    assert mount["readOnly"] is True
    claim = pool.spec.model.source.split("://")[1].split("/")[0]
    assert _volumes(pod)[mount["name"]]["persistentVolumeClaim"] == {
        "claimName": claim, "readOnly": True}


@pytest.mark.parametrize("name", ["vllm-s3", "vllm-gs"])
def test_object_store_sources_stream_with_runai(name):
    pool = POOLS[name]
    c = engine_container(children(pool), f"{pool.name}-unified")
    assert c["args"][c["args"].index("--load-format") + 1] == "runai_streamer"
    assert c["args"][c["args"].index("--model") + 1] == pool.spec.model.source
    assert {m["name"] for m in c["volumeMounts"]} == {"tmp", "cache", "shm"}


def test_builtin_source_mounts_nothing():
    c = engine_container(children(POOLS["local-sim"]), "local-sim-unified")
    assert {m["name"] for m in c["volumeMounts"]} == {"tmp", "cache"}


@pytest.mark.parametrize(("base", "source", "needle"), [
    ("local-cpu.yaml", "file:///models/x.gguf", "file://"),
    ("vllm-unified.yaml", "file:///models/llama", "file://"),
    ("local-cpu.yaml", "hf://HuggingFaceTB/SmolLM2-135M", "hf://"),
    ("local-cpu.yaml", "s3://bucket/model", "s3://"),
    ("vllm-unified.yaml", "pvc://Bad_Claim/model", "PersistentVolumeClaim"),
])
def test_unservable_sources_name_the_field(base, source, needle):
    manifest = example(base)
    manifest["spec"]["model"]["source"] = source
    pool = pool_from(manifest)
    with pytest.raises(UnservableSpec) as info:
        build_children(pool, tokens=TOKENS)
    assert isinstance(info.value, SpecError)  # the caller's Degraded/InvalidSpec path
    assert info.value.path == "spec.model.source" and needle in str(info.value)


# --- the vLLM preStop script, run for real against a fake /metrics ---


class _Metrics(BaseHTTPRequestHandler):
    busy = 0.0

    def do_GET(self):  # noqa: N802
        body = ("# HELP vllm:num_requests_running x\n"
                f'vllm:num_requests_running{{engine="0",model_name="m"}} {self.busy}\n'
                'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
                'vllm:num_requests_running_total 5.0\n').encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def metrics_server():
    server = HTTPServer(("127.0.0.1", 0), _Metrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def _run_prestop(port: int, drain: int) -> float:
    script = vllm_prestop_script(drain, settle_s=0, port=port)
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", script], check=True, timeout=30)
    return time.monotonic() - started


def test_prestop_returns_once_idle_and_waits_while_busy(metrics_server):
    port = metrics_server.server_address[1]
    _Metrics.busy = 0.0
    assert _run_prestop(port, drain=20) < 5
    _Metrics.busy = 3.0
    assert _run_prestop(port, drain=2) >= 2  # held until the drain timeout


def test_prestop_returns_when_the_engine_is_gone():
    assert _run_prestop(1, drain=20) < 5
