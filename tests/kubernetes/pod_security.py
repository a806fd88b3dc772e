"""A table-driven checker for the Pod Security Standards "restricted" profile (the rules of
the baseline profile plus restricted's own), over a PodSpec dict. Each rule returns the
violations it finds; `violations(pod)` runs them all."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

Pod = dict[str, Any]
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral",
                   "persistentVolumeClaim", "projected", "secret"}
ALLOWED_ADD_CAPS = {"NET_BIND_SERVICE"}
ALLOWED_SECCOMP = {"RuntimeDefault", "Localhost"}
SAFE_SYSCTLS = {"kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range",
                "net.ipv4.ip_unprivileged_port_start", "net.ipv4.tcp_syncookies",
                "net.ipv4.ping_group_range", "net.ipv4.ip_local_reserved_ports",
                "net.ipv4.tcp_keepalive_time", "net.ipv4.tcp_fin_timeout",
                "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes"}
ALLOWED_SELINUX_TYPES = {"", "container_t", "container_init_t", "container_kvm_t",
                         "container_engine_t"}


def containers(pod: Pod) -> Iterator[dict[str, Any]]:
    for key in ("initContainers", "containers", "ephemeralContainers"):
        yield from pod.get(key) or []


def _ctx(c: dict[str, Any]) -> dict[str, Any]:
    return c.get("securityContext") or {}


def _pod_ctx(pod: Pod) -> dict[str, Any]:
    return pod.get("securityContext") or {}


def host_namespaces(pod: Pod) -> list[str]:
    return [f"{k} is set" for k in ("hostNetwork", "hostPID", "hostIPC") if pod.get(k)]


def privileged(pod: Pod) -> list[str]:
    return [f"{c['name']}: privileged" for c in containers(pod) if _ctx(c).get("privileged")]


def windows_host_process(pod: Pod) -> list[str]:
    ctxs = [_pod_ctx(pod)] + [_ctx(c) for c in containers(pod)]
    return ["hostProcess" for x in ctxs if (x.get("windowsOptions") or {}).get("hostProcess")]


def capabilities(pod: Pod) -> list[str]:
    out = []
    for c in containers(pod):
        caps = _ctx(c).get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or []):
            out.append(f"{c['name']}: capabilities do not drop ALL")
        extra = set(caps.get("add") or []) - ALLOWED_ADD_CAPS
        if extra:
            out.append(f"{c['name']}: adds {sorted(extra)}")
    return out


def host_path_volumes(pod: Pod) -> list[str]:
    return [f"volume {v['name']}: hostPath" for v in pod.get("volumes") or [] if "hostPath" in v]


def volume_types(pod: Pod) -> list[str]:
    out = []
    for v in pod.get("volumes") or []:
        kinds = set(v) - {"name"}
        if not kinds or not kinds <= ALLOWED_VOLUMES:
            out.append(f"volume {v['name']}: type {sorted(kinds)} not allowed")
    return out


def host_ports(pod: Pod) -> list[str]:
    return [f"{c['name']}: hostPort {p['hostPort']}" for c in containers(pod)
            for p in c.get("ports") or [] if p.get("hostPort")]


def privilege_escalation(pod: Pod) -> list[str]:
    return [f"{c['name']}: allowPrivilegeEscalation is not false" for c in containers(pod)
            if _ctx(c).get("allowPrivilegeEscalation") is not False]


def run_as_non_root(pod: Pod) -> list[str]:
    pod_value = _pod_ctx(pod).get("runAsNonRoot")
    out = []
    for c in containers(pod):
        value = _ctx(c).get("runAsNonRoot", pod_value)
        if value is not True:
            out.append(f"{c['name']}: runAsNonRoot is not true")
    return out


def run_as_user(pod: Pod) -> list[str]:
    ctxs = [("pod", _pod_ctx(pod))] + [(c["name"], _ctx(c)) for c in containers(pod)]
    return [f"{name}: runAsUser 0" for name, x in ctxs if x.get("runAsUser") == 0]


def seccomp(pod: Pod) -> list[str]:
    pod_type = (_pod_ctx(pod).get("seccompProfile") or {}).get("type")
    out = []
    for c in containers(pod):
        kind = (_ctx(c).get("seccompProfile") or {}).get("type", pod_type)
        if kind not in ALLOWED_SECCOMP:
            out.append(f"{c['name']}: seccompProfile {kind!r}")
    return out


def proc_mount(pod: Pod) -> list[str]:
    return [f"{c['name']}: procMount {_ctx(c)['procMount']}" for c in containers(pod)
            if _ctx(c).get("procMount") not in (None, "Default")]


def sysctls(pod: Pod) -> list[str]:
    return [f"sysctl {s['name']}" for s in _pod_ctx(pod).get("sysctls") or []
            if s["name"] not in SAFE_SYSCTLS]


def selinux(pod: Pod) -> list[str]:
    out = []
    for x in [_pod_ctx(pod)] + [_ctx(c) for c in containers(pod)]:
        opts = x.get("seLinuxOptions") or {}
        if opts.get("type", "") not in ALLOWED_SELINUX_TYPES or opts.get("user") \
                or opts.get("role"):
            out.append(f"seLinuxOptions {opts}")
    return out


def apparmor(pod: Pod) -> list[str]:
    return [f"appArmorProfile {x['appArmorProfile']}"
            for x in [_pod_ctx(pod)] + [_ctx(c) for c in containers(pod)]
            if (x.get("appArmorProfile") or {}).get("type") == "Unconfined"]


RULES: dict[str, Callable[[Pod], list[str]]] = {
    "hostNamespaces": host_namespaces, "privileged": privileged,
    "windowsHostProcess": windows_host_process, "capabilities": capabilities,
    "hostPathVolumes": host_path_volumes, "volumeTypes": volume_types, "hostPorts": host_ports,
    "allowPrivilegeEscalation": privilege_escalation, "runAsNonRoot": run_as_non_root,
    "runAsUser": run_as_user, "seccompProfile": seccomp, "procMount": proc_mount,
    "sysctls": sysctls, "seLinux": selinux, "appArmor": apparmor,
}


def violations(pod: Pod) -> dict[str, list[str]]:
    found = {name: rule(pod) for name, rule in RULES.items()}
    return {name: v for name, v in found.items() if v}
