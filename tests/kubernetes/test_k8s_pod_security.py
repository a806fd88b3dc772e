"""Every engine and router pod meets Pod Security "restricted" (checked by a small table of
the profile's rules, which is itself tested on pods that break each rule), and runs with a
read-only root filesystem whose writable paths are emptyDirs."""

from __future__ import annotations

import copy

import pytest
from k8s_pools import all_pools, children, pod_specs
from pod_security import RULES, violations

POOLS = all_pools()
PODS = {f"{pool}/{name}": spec for pool in sorted(POOLS)
        for name, spec in pod_specs(children(POOLS[pool]))}
GOOD = next(iter(PODS.values()))


def test_every_pool_has_engine_and_router_pods():
    assert len(PODS) >= 2 * len(POOLS) - 2  # the two sidecar pools have no router pods
    assert any(k.endswith("-router") for k in PODS)
    assert any(c["name"] == "router" for p in PODS.values() for c in p.get("initContainers", []))


@pytest.mark.parametrize("name", sorted(PODS))
def test_pod_meets_restricted(name):
    assert violations(PODS[name]) == {}


@pytest.mark.parametrize("name", sorted(PODS))
def test_root_filesystem_is_read_only_and_tmp_is_writable(name):
    pod = PODS[name]
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    for c in pod["containers"] + pod.get("initContainers", []):
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert mounts["/tmp"] in empty_dirs and mounts["/cache"] in empty_dirs
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["automountServiceAccountToken"] is False


def _break(mutate):
    pod = copy.deepcopy(GOOD)
    mutate(pod, pod["containers"][0])
    return pod


def _ctx(c):
    return c["securityContext"]


BROKEN = {
    "hostNamespaces": lambda p, c: p.update(hostNetwork=True),
    "privileged": lambda p, c: _ctx(c).update(privileged=True),
    "windowsHostProcess": lambda p, c: _ctx(c).update(windowsOptions={"hostProcess": True}),
    "capabilities": lambda p, c: _ctx(c).update(capabilities={"drop": ["ALL"],
                                                              "add": ["SYS_ADMIN"]}),
    "hostPathVolumes": lambda p, c: p["volumes"].append({"name": "h", "hostPath": {"path": "/"}}),
    "volumeTypes": lambda p, c: p["volumes"].append({"name": "n", "nfs": {"server": "x",
                                                                          "path": "/"}}),
    "hostPorts": lambda p, c: c["ports"][0].update(hostPort=8000),
    "allowPrivilegeEscalation": lambda p, c: _ctx(c).pop("allowPrivilegeEscalation"),
    "runAsNonRoot": lambda p, c: _ctx(c).update(runAsNonRoot=False),
    "runAsUser": lambda p, c: p["securityContext"].update(runAsUser=0),
    "seccompProfile": lambda p, c: _ctx(c).update(seccompProfile={"type": "Unconfined"}),
    "procMount": lambda p, c: _ctx(c).update(procMount="Unmasked"),
    "sysctls": lambda p, c: p["securityContext"].update(sysctls=[{"name": "kernel.msgmax",
                                                                  "value": "1"}]),
    "seLinux": lambda p, c: _ctx(c).update(seLinuxOptions={"type": "spc_t"}),
    "appArmor": lambda p, c: _ctx(c).update(appArmorProfile={"type": "Unconfined"}),
}


def test_every_rule_has_a_breaking_case():
    assert set(BROKEN) == set(RULES)


@pytest.mark.parametrize("rule", sorted(BROKEN))
def test_the_checker_catches_each_rule(rule):
    found = violations(_break(BROKEN[rule]))
    assert rule in found, found


def test_caps_drop_all_missing_and_pod_level_only_settings():
    pod = _break(lambda p, c: _ctx(c).update(capabilities={}))
    assert "capabilities" in violations(pod)
    pod = _break(lambda p, c: (_ctx(c).pop("runAsNonRoot"), _ctx(c).pop("seccompProfile")))
    assert violations(pod) == {}  # the pod-level settings still cover the container
    pod["securityContext"].pop("runAsNonRoot")
    pod["securityContext"].pop("seccompProfile")
    assert {"runAsNonRoot", "seccompProfile"} <= set(violations(pod))
