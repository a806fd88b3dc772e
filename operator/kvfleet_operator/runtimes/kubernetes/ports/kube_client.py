"""`KubeClient`: the few Kubernetes API calls the operator makes, over `kubernetes.aio`.

`kubernetes.aio` is the official client's asyncio half (aiohttp underneath, like the rest
of kvfleet): it loads kubeconfig or the in-cluster service account, handles exec and OIDC
auth plugins and TLS, and runs on kopf's event loop without a thread per call. We use its
generic request path (`param_serialize` / `call_api`) rather than one typed API class per
kind, so one `apply` serves Deployments, Secrets, PDBs and NetworkPolicies alike and bodies
stay the plain dicts the `build_*` functions return.

- `apply(obj)`: server-side apply (`PATCH`, `application/apply-patch+yaml`,
  `fieldManager=kvfleet`, `force=true`: kvfleet sends only the fields it owns, so forcing
  takes back only those). A 404 (an apiserver that does not create on apply, e.g. a mock)
  falls back to `POST`; a 409 on that create means someone created it meanwhile, which
  counts as success, and the apply is sent again.
- `merge_patch`: JSON merge patches for what kvfleet does not own whole (pod annotations,
  the pool's status and its loop-state annotation); `strategic_patch` for a pod's status
  condition (kvfleet's readiness gate), merged by type beside the kubelet's.
- Writes return the API server's answer (the object as written, with its resourceVersion):
  `KubeReplicaRuntime` keeps it until kopf's index shows that version (`pool_index.py`).
  Nothing here lists: the pools' Deployments and Pods come from kopf's watches.
- Errors are `ApiError(status, reason, message)` (status 0: no answer at all); nothing logs
  a request body (Secrets).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import aiohttp
import yaml
from kubernetes.aio import client as kclient
from kubernetes.aio import config as kconfig

from kvfleet_operator.loop.ports import PortUnavailable

FIELD_MANAGER = "kvfleet"
APPLY_PATCH = "application/apply-patch+yaml"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"  # lists merge by key (conditions)
TIMEOUT_S = 30.0

# apiVersion/kind -> plural, for the kinds kvfleet reads or writes.
PLURALS: dict[str, str] = {
    "Secret": "secrets", "ConfigMap": "configmaps", "Service": "services", "Pod": "pods",
    "Event": "events", "Deployment": "deployments", "PodDisruptionBudget": "poddisruptionbudgets",
    "NetworkPolicy": "networkpolicies", "InferencePool": "inferencepools",
}


class ApiError(PortUnavailable):
    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


def collection_path(api_version: str, kind: str, namespace: str) -> str:
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    return f"{base}/namespaces/{quote(namespace)}/{PLURALS[kind]}"


def object_path(api_version: str, kind: str, namespace: str, name: str) -> str:
    return f"{collection_path(api_version, kind, namespace)}/{quote(name)}"


def path_of(obj: Mapping[str, Any]) -> str:
    meta = obj["metadata"]
    return object_path(obj["apiVersion"], obj["kind"], meta["namespace"], meta["name"])


def kubeconfig_paths() -> list[str]:
    """The kubeconfig files kubectl would read: $KUBECONFIG's, else ~/.kube/config (read
    now: the client library fixes its default when it is imported)."""
    return [os.path.expanduser(p) for p in
            (os.environ.get("KUBECONFIG") or "~/.kube/config").split(os.pathsep) if p]


class CredentialsError(Exception):
    """No usable credentials, in one line: retrying cannot conjure them."""


async def load_configuration() -> kclient.Configuration:
    """In-cluster service account when there is one, else kubeconfig (as kubectl does);
    CredentialsError when neither gives a configuration."""
    configuration = kclient.Configuration()
    try:
        kconfig.load_incluster_config(client_configuration=configuration)
        return configuration
    except kconfig.ConfigException:
        pass
    paths = kubeconfig_paths()
    where = os.pathsep.join(paths) or "~/.kube/config"
    if not any(map(os.path.exists, paths)):
        raise CredentialsError(f"no Kubernetes credentials: not in a cluster, and no "
                               f"kubeconfig at {where} (set KUBECONFIG)")
    try:
        await kconfig.load_kube_config(config_file=os.pathsep.join(paths),
                                       client_configuration=configuration)
    except (kconfig.ConfigException, OSError, ValueError, TypeError, AttributeError,
            yaml.YAMLError) as exc:  # fmt: skip
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise CredentialsError(f"no usable Kubernetes credentials (the service account in "
                               f"a cluster, else the kubeconfig {where}): {reason}") from None
    return configuration


PROXY_ENV = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
             "all_proxy", "NETRC")  # fmt: skip


def session_kwargs(environ: Mapping[str, str]) -> dict[str, Any]:
    """kubernetes.aio's session trusts the environment, so aiohttp reads ~/.netrc and the
    proxy variables on every request (a sixth of the operator's CPU with 1,000 pools). Keep
    that only where the environment names a proxy or a netrc file."""
    return {} if any(environ.get(k) for k in PROXY_ENV) else {"trust_env": False}


class KubeClient:
    def __init__(self, configuration: kclient.Configuration) -> None:
        extra = session_kwargs(os.environ)
        if extra:
            configuration.client_session_kwargs = {
                **(getattr(configuration, "client_session_kwargs", None) or {}), **extra}
        self._api = kclient.ApiClient(configuration)

    async def close(self) -> None:
        await self._api.close()

    async def request(
        self, method: str, path: str, *, body: Any = None, query: Mapping[str, str] | None = None,
        content_type: str = "application/json",
    ) -> Any:  # fmt: skip
        method_, url, headers, body_, post = await self._api.param_serialize(
            method, path, query_params=list((query or {}).items()),
            header_params={"Content-Type": content_type, "Accept": "application/json"},
            body=body, auth_settings=["BearerToken"],
        )  # fmt: skip
        try:
            response = await self._api.call_api(method_, url, headers, body_, post,
                                                _request_timeout=TIMEOUT_S)  # fmt: skip
            await response.read()
            return self._api.response_deserialize(response, {"2XX": "object"}).data
        except kclient.ApiException as exc:
            raise _api_error(exc) from None
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:  # no answer at all
            raise ApiError(0, "Unreachable", f"{type(exc).__name__}: {exc}") from None

    async def get(self, path: str) -> dict[str, Any] | None:
        """The object, or None when it does not exist."""
        try:
            found: dict[str, Any] = await self.request("GET", path)
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return found

    async def create(self, obj: Mapping[str, Any]) -> None:
        """POST; a 409 (it exists already) counts as success."""
        meta = obj["metadata"]
        path = collection_path(obj["apiVersion"], obj["kind"], meta["namespace"])
        try:
            await self.request("POST", path, body=dict(obj))
        except ApiError as exc:
            if exc.status != 409:
                raise

    async def apply(self, obj: Mapping[str, Any]) -> Any:
        """The object as applied (the API server's answer)."""
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        try:
            return await self.request("PATCH", path_of(obj), body=dict(obj), query=query,
                                      content_type=APPLY_PATCH)  # fmt: skip
        except ApiError as exc:
            if exc.status != 404:
                raise
        await self.create(obj)
        return await self.request("PATCH", path_of(obj), body=dict(obj), query=query,
                                  content_type=APPLY_PATCH)  # fmt: skip

    async def merge_patch(self, path: str, patch: Mapping[str, Any]) -> Any:
        """The object as patched (the API server's answer)."""
        return await self.request("PATCH", path, body=dict(patch), content_type=MERGE_PATCH,
                                  query={"fieldManager": FIELD_MANAGER})  # fmt: skip

    async def strategic_patch(self, path: str, patch: Mapping[str, Any]) -> Any:
        """A pod's status conditions merge by `type`, leaving the kubelet's own in place."""
        return await self.request("PATCH", path, body=dict(patch),
                                  content_type=STRATEGIC_PATCH,
                                  query={"fieldManager": FIELD_MANAGER})  # fmt: skip

    async def post(self, path: str, body: Mapping[str, Any]) -> None:
        await self.request("POST", path, body=dict(body))


def _api_error(exc: kclient.ApiException) -> ApiError:
    status = int(exc.status or 0)
    reason = str(exc.reason or "")
    message = ""
    try:
        data = json.loads(exc.body or "")
        message = str(data.get("message") or "")[:300]
    except (TypeError, ValueError, AttributeError):
        message = str(exc.body or "")[:300]
    return ApiError(status, reason, message)
