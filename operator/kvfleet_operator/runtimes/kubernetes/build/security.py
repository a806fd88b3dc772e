"""The securityContext every kvfleet pod runs with: Pod Security "restricted", plus a
read-only root filesystem (writable paths are emptyDirs, see `scratch_volumes`)."""

from __future__ import annotations

from typing import Any

RUN_AS_UID = 1000  # fixed, non-root; the images need no particular user
RUNTIME_DEFAULT = {"type": "RuntimeDefault"}
TMP_MOUNT = "/tmp"
CACHE_MOUNT = "/cache"  # HOME and every tool cache (vLLM, Triton, torch, XDG)


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_UID,
        "runAsGroup": RUN_AS_UID,
        "fsGroup": RUN_AS_UID,
        # Large model volumes: chown only when the root's group is wrong, not every start.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": dict(RUNTIME_DEFAULT),
    }


def container_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS_UID,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": dict(RUNTIME_DEFAULT),
    }


def scratch_volumes() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The writable emptyDirs a read-only root needs: /tmp and the cache home."""
    volumes = [{"name": "tmp", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}]
    mounts = [{"name": "tmp", "mountPath": TMP_MOUNT},
              {"name": "cache", "mountPath": CACHE_MOUNT}]
    return volumes, mounts


def cache_env() -> list[dict[str, Any]]:
    """Point HOME and the caches vLLM, torch and Triton write at the writable emptyDir."""
    pairs = {
        "HOME": CACHE_MOUNT,
        "XDG_CACHE_HOME": CACHE_MOUNT,
        "XDG_CONFIG_HOME": f"{CACHE_MOUNT}/config",
        "VLLM_CACHE_ROOT": f"{CACHE_MOUNT}/vllm",
        "TRITON_CACHE_DIR": f"{CACHE_MOUNT}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_MOUNT}/inductor",
        "KVFLEET_KERNEL_DIR": f"{CACHE_MOUNT}/kvfleet-kernels",
        "TMPDIR": TMP_MOUNT,
    }
    return [{"name": k, "value": v} for k, v in pairs.items()]
