"""`routing.gateway: {kind: gie}`: a GIE `inference.networking.k8s.io/v1` InferencePool
over the pool's engine pods, pointing at kvfleet's endpoint picker (Deployment + Service),
validated against GIE's CRD (v1.0.0, vendored unchanged under tests/fixtures/gie: see
its header) with the apiserver's checks (schema, defaults, CEL) and plain JSON Schema.

* the GIE pool selects exactly the engine pods, on their port, and its endpointPickerRef
  names the picker Service's ext_proc port with the spec's failureMode;
* the picker pods run `kvfleet router --epp-port 9002`, are found with the pool's routers
  (so the operator pushes them the same config), and are never behind the router Service;
* every built Kubernetes object validates strictly; no gateway, no GIE children; sidecar
  routers with a gateway are refused (the picker would never be programmed).
"""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from k8s_pools import children, example, pool_from, variants
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.epp_pod import EPP_PORT, EPP_PORT_NAME
from kvfleet_operator.runtimes.kubernetes.build.errors import UnservableSpec
from kvfleet_operator.runtimes.kubernetes.build.gie_pool import GIE_API_VERSION
from kvfleet_operator.tools.crd_validate import validate_manifest

GIE_CRD_PATH = Path(__file__).parents[1] / "fixtures" / "gie" / \
    "inference.networking.k8s.io_inferencepools.yaml"
GIE_CRD = next(d for d in yaml.safe_load_all(GIE_CRD_PATH.read_text()) if d)
GIE_SCHEMA = GIE_CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def with_gateway(data: dict, name: str, **gateway: str) -> dict:
    out = copy.deepcopy(data)
    out["metadata"]["name"] = name
    out["spec"].setdefault("routing", {})["gateway"] = {"kind": "gie", **gateway}
    return out


POOLS = {
    "vllm-unified": with_gateway(example("vllm-unified.yaml"), "gw-vllm"),
    "local-cpu-open": with_gateway(example("local-cpu.yaml"), "gw-cpu", failureMode="FailOpen"),
    "local-sim": with_gateway(example("local-sim.yaml"), "gw-sim"),
}


def built(name: str) -> list[dict]:
    return children(pool_from(POOLS[name]))


def one(objs: list[dict], kind: str, name: str) -> dict:
    [found] = [o for o in objs if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def selects(match: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in match.items())


def pod_labels(objs: list[dict]) -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: o["spec"]["template"]["metadata"]["labels"]
            for o in objs if o["kind"] == "Deployment"}


def test_the_vendored_gie_crd_is_upstreams_v1_with_its_license():
    head = GIE_CRD_PATH.read_text().split("---", 1)[0]
    assert "Licensed under the Apache License, Version 2.0" in head
    assert "tag v1.0.0" in head
    bundle = GIE_CRD["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"]
    assert bundle == "v1.0.0"
    assert "config/crd/bases/inference.networking.k8s.io_inferencepools.yaml" in head
    assert GIE_CRD["metadata"]["name"] == "inferencepools.inference.networking.k8s.io"
    assert kubernetes_validate.validate(GIE_CRD, "1.33", strict=True)


@pytest.mark.parametrize("name", sorted(POOLS))
def test_the_gie_pool_validates_against_gies_crd(name):
    gie = one(built(name), "InferencePool", POOLS[name]["metadata"]["name"])
    assert gie["apiVersion"] == GIE_API_VERSION
    assert validate_manifest(gie, GIE_CRD) == []  # schema (strict fields), defaults, CEL
    jsonschema.Draft202012Validator(GIE_SCHEMA).validate(gie)


@pytest.mark.parametrize("name", sorted(POOLS))
def test_the_gie_pool_selects_the_engines_and_names_the_picker(name):
    objs = built(name)
    pool = POOLS[name]["metadata"]["name"]
    spec = one(objs, "InferencePool", pool)["spec"]
    labels = pod_labels(objs)
    engines = {n for n, lab in labels.items() if lab[meta.COMPONENT_LABEL] == meta.ENGINE}
    assert engines and {n for n, lab in labels.items()
                        if selects(spec["selector"]["matchLabels"], lab)} == engines
    for n in engines:  # the engine container listens on the target port
        ports = one(objs, "Deployment", n)["spec"]["template"]["spec"]["containers"][-1]["ports"]
        assert spec["targetPorts"] == [{"number": p["containerPort"]} for p in ports
                                       if p["name"] in ("http", "engine")][:1]
    ref = spec["endpointPickerRef"]
    service = one(objs, "Service", ref["name"])
    assert ref["kind"] == "Service" and ref["group"] == ""
    port = next(p for p in service["spec"]["ports"] if p["port"] == ref["port"]["number"])
    assert (port["port"], port["targetPort"]) == (EPP_PORT, EPP_PORT_NAME)
    want = POOLS[name]["spec"]["routing"]["gateway"].get("failureMode", "FailClose")
    assert ref["failureMode"] == want


@pytest.mark.parametrize("name", sorted(POOLS))
def test_the_picker_runs_the_router_with_its_ext_proc_front(name):
    objs = built(name)
    pool = POOLS[name]["metadata"]["name"]
    epp = one(objs, "Deployment", f"{pool}-epp")
    template = epp["spec"]["template"]
    (container,) = template["spec"]["containers"]
    assert container["command"] == ["kvfleet", "router"]
    args = container["args"]
    assert args[args.index("--epp-port") + 1] == str(EPP_PORT)
    assert "--epp-insecure" not in args  # TLS on the ext_proc port, as GIE's reference
    assert {"name": EPP_PORT_NAME, "containerPort": EPP_PORT, "protocol": "TCP"} in \
        container["ports"]
    labels = template["metadata"]["labels"]
    # found with the routers (config pushes), never behind the router Service
    assert selects(meta.selector(pool_from(POOLS[name]), meta.ROUTER), labels)
    router_svc = one(objs, "Service", f"{pool}-router")
    assert not selects(router_svc["spec"]["selector"], labels)
    epp_svc = one(objs, "Service", f"{pool}-epp")
    assert [n for n, lab in pod_labels(objs).items()
            if selects(epp_svc["spec"]["selector"], lab)] == [f"{pool}-epp"]
    assert epp["spec"]["selector"]["matchLabels"] == epp_svc["spec"]["selector"]


@pytest.mark.parametrize("name", sorted(POOLS))
def test_the_engines_open_their_port_to_the_gateway(name):
    objs = built(name)
    pool = POOLS[name]["metadata"]["name"]
    policy = one(objs, "NetworkPolicy", f"{pool}-gateway")
    target = one(objs, "InferencePool", pool)["spec"]["targetPorts"][0]["number"]
    assert policy["spec"]["ingress"] == [{"ports": [{"protocol": "TCP", "port": target}]}]


@pytest.mark.parametrize("version", ["1.30.0", "1.33.0"])
@pytest.mark.parametrize("name", sorted(POOLS))
def test_every_kubernetes_child_validates(name, version):
    for obj in built(name):
        if obj["kind"] != "InferencePool":
            kubernetes_validate.validate(obj, version, strict=True)


def test_sidecar_routers_and_a_gateway_are_refused_before_anything_is_built():
    with pytest.raises(UnservableSpec) as info:
        children(pool_from(with_gateway(variants()["vllm-sidecar"], "gw-side")))
    assert info.value.path == "spec.routing.gateway" and "placement: deployment" in str(
        info.value)


def test_no_gateway_no_gie_children():
    objs = children(pool_from(example("vllm-unified.yaml")))
    assert not [o for o in objs if o["kind"] == "InferencePool" or
                o["metadata"]["name"].endswith(("-epp", "-gateway"))]


@pytest.mark.parametrize("breakage, layer", [
    (lambda s: s["endpointPickerRef"].update(failureMode="Sometimes"), "schema"),
    (lambda s: s["endpointPickerRef"].pop("port"), "cel"),
    (lambda s: s.update(targetPorts=[{"number": 8000}, {"number": 8001}]), "schema"),  # v1: one
    (lambda s: s["selector"]["matchLabels"].update(bad="-not-a-label-"), "schema"),
    (lambda s: s.pop("endpointPickerRef"), "schema"),
])
def test_the_gie_validation_catches_a_broken_pool(breakage, layer):
    gie = one(built("vllm-unified"), "InferencePool", "gw-vllm")
    breakage(gie["spec"])
    assert {v.layer for v in validate_manifest(gie, GIE_CRD)} == {layer}
