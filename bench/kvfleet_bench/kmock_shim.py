"""kmock 0.8 made just real enough for the operator: the tests (tests/kubernetes) and
bench/operator_scale.py run `kvfleet`'s operator against it.

`KubeShim` fills kmock's known gaps (see ../shared/DESIGN.md, testing ladder item 3):

- objects get a `uid`, a `resourceVersion` (bumped on every write), a `generation` (bumped
  when a PATCH of the main resource touches `spec`) and a `creationTimestamp`;
- the namespace is filled in from the URL on create, a `generateName` becomes a name;
- lists carry `kind: <Kind>List` and honour equality-based `labelSelector`s;
- core discovery reports `v1`, not `/v1`;
- a watch sees every write after its snapshot (kmock's loses those landing while it streams
  the snapshot);
- a CRD created through the API is served afterwards (for `kubectl apply -f crd.yaml`);
- `fail(method, path, status, times, persist=...)` injects API errors: with `persist=True`
  the write still lands (a 409 on create after someone else created the object).

Still missing, so never asserted through it: server-side apply semantics (kmock merges
dicts, replaces lists), `/scale`, validation, garbage collection.

`api` sends one request to it as a user would; `write_kubeconfig` points a real client
(kubectl, the operator) at it. The tests' harness (kopf in-process) is in
tests/kubernetes/kmock_shim.py.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import attrs
import kmock
import yaml
from kmock._internal import references
from kvfleet_operator.api.pool import GROUP, VERSION

RESOURCES: dict[str, tuple[str, set[str]]] = {
    f"{GROUP}/{VERSION}/inferencepools": ("InferencePool", {"status"}),
    "v1/secrets": ("Secret", set()),
    "v1/configmaps": ("ConfigMap", set()),
    "v1/services": ("Service", set()),
    "v1/pods": ("Pod", {"status"}),
    "v1/events": ("Event", set()),
    "apps/v1/deployments": ("Deployment", {"status", "scale"}),
    "policy/v1/poddisruptionbudgets": ("PodDisruptionBudget", {"status"}),
    "networking.k8s.io/v1/networkpolicies": ("NetworkPolicy", set()),
}
CLUSTER_RESOURCES = {  # kopf waits for these in discovery before it watches anything
    "v1/namespaces": "Namespace",
    "apiextensions.k8s.io/v1/customresourcedefinitions": "CustomResourceDefinition",
}
VERBS = {"get", "list", "watch", "create", "update", "patch", "delete"}


@dataclass
class Fault:
    method: str
    path: re.Pattern[str]
    status: int
    times: int
    persist: bool


@attrs.define(kw_only=True)
class KubeShim(kmock.KubernetesEmulator):
    _faults: list[Fault] = attrs.field(factory=list, init=False)
    _rv: Any = attrs.field(factory=lambda: itertools.count(1), init=False)

    def declare(self) -> None:
        for key, (kind, subresources) in RESOURCES.items():
            self.resources[key] = kmock.ResourceInfo(
                kind=kind, singular=kind.lower(), namespaced=True, verbs=VERBS,
                subresources=subresources)  # fmt: skip
        for key, kind in CLUSTER_RESOURCES.items():
            self.resources[key] = kmock.ResourceInfo(kind=kind, singular=kind.lower(),
                                                     namespaced=False, verbs=VERBS)

    def fail(self, method: str, path: str, status: int, times: int = 1,
             persist: bool = False) -> None:  # fmt: skip
        self._faults.append(Fault(method.upper(), re.compile(path), status, times, persist))

    def _take_fault(self, request: kmock.Request) -> Fault | None:
        for fault in self._faults:
            if fault.times > 0 and request.method.value == fault.method \
                    and fault.path.search(request.url.path):  # fmt: skip
                fault.times -= 1
                return fault
        return None

    def _fill(self, request: kmock.Request) -> None:
        data = request.data
        if request.resource is None or not isinstance(data, dict):
            return
        metadata = data.setdefault("metadata", {})
        if request.action == kmock.action.CREATE:
            if request.namespace and not metadata.get("namespace"):
                metadata["namespace"] = request.namespace
            if not metadata.get("name") and metadata.get("generateName"):
                metadata["name"] = metadata["generateName"] + uuid.uuid4().hex[:5]
            metadata.setdefault("uid", str(uuid.uuid4()))
            metadata.setdefault("generation", 1)
            metadata.setdefault("creationTimestamp",
                                datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            metadata["resourceVersion"] = str(next(self._rv))
            if request.resource.plural == "customresourcedefinitions":
                self._serve_crd(data)
        elif request.action == kmock.action.UPDATE:
            key = (request.resource, request.namespace, request.name)
            metadata["resourceVersion"] = str(next(self._rv))
            if "spec" in data and not request.subresource and key in self.objects:
                current = self.objects[key].get("metadata", {}).get("generation", 1)
                metadata["generation"] = int(current) + 1

    def _serve_crd(self, crd: dict[str, Any]) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        for version in spec.get("versions") or []:
            key = f"{spec.get('group')}/{version['name']}/{names.get('plural')}"
            self.resources[key] = kmock.ResourceInfo(
                kind=names.get("kind"), singular=names.get("singular"),
                namespaced=spec.get("scope") == "Namespaced", verbs=VERBS,
                shortnames=set(names.get("shortNames") or []),
                subresources=set((version.get("subresources") or {}).keys()))  # fmt: skip

    async def _handle(self, request: kmock.Request) -> Any:
        fault = self._take_fault(request)
        if fault is not None and not fault.persist:
            return await self._render_error(kmock.KubernetesError(
                status=fault.status, reason="Injected", message=f"injected {fault.status}"))
        self._fill(request)
        response = await super()._handle(request)
        if fault is not None:
            return await self._render_error(kmock.KubernetesError(
                status=fault.status, reason="Injected", message=f"injected {fault.status}"))
        return response

    async def _serve_list(self, request: kmock.Request) -> Any:
        result = await super()._serve_list(request)
        selector = request.params.get("labelSelector") or ""
        wanted = dict(part.split("=", 1) for part in selector.split(",") if "=" in part)
        result["items"] = [
            item for item in result["items"]
            if all(((item.get("metadata") or {}).get("labels") or {}).get(k) == v
                   for k, v in wanted.items())
        ]  # fmt: skip
        assert request.resource is not None
        info = self.resources[request.resource]
        result["kind"] = f"{info.kind}List"
        group, version = request.resource.group, request.resource.version
        result["apiVersion"] = f"{group}/{version}" if group else version
        return result

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        """kmock's watch without its gap: kmock streams a snapshot of the objects and only
        then marks the event bus, so a write landing in between reached no watcher (kopf,
        which patches as soon as it lists, would wait for that event forever). Here the mark
        and the snapshot are taken under the lock every write holds."""
        yield b""  # the headers go out even if nothing happens
        resource = request.resource
        assert resource is not None
        bus = self._buses[resource]

        def watched(namespace: str | None, name: str | None) -> bool:
            return ((request.namespace is None or namespace == request.namespace)
                    and (request.name is None or name == request.name))  # fmt: skip

        async with self._lock:
            marker = await bus.mark()
            snapshot = [
                {"type": "ADDED", "object": obj.raw}
                for (r, namespace, name), obj in self.objects.items()
                if r == resource and not obj.deleted and watched(namespace, name)
            ]
        try:
            for event in snapshot:
                yield event
            async for event in bus.stream(since=marker):
                metadata = (event.get("object") or {}).get("metadata") or {}
                if watched(metadata.get("namespace"), metadata.get("name")):
                    yield event
        finally:
            await bus.unmark(marker)

    async def _serve_version(self, request: kmock.Request) -> Any:
        result = await super()._serve_version(request)
        result["groupVersion"] = result["groupVersion"].lstrip("/")
        return result

    # --- reading back -------------------------------------------------------------------

    def objs(self, resource: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Live objects of `resource` (e.g. 'apps/v1/deployments')."""
        res = references.resource(resource)
        out = []
        for (r, ns, _), obj in self.objects.items():
            if r == res and not obj.deleted and (namespace is None or ns == namespace):
                out.append(json.loads(json.dumps(obj.raw)))
        return out

    def obj(self, resource: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = [o for o in self.objs(resource, namespace) if o["metadata"]["name"] == name]
        return found[0] if found else None

    def operator_calls(self) -> set[tuple[str, str, str]]:
        """(apiGroup, resource[/subresource], RBAC verb) of every API call kopf or kvfleet's
        client made (the tests' own requests and discovery excluded)."""
        out = set()
        for r in self._requests:
            agent = r.headers.get("User-Agent", "")
            if r.resource is None or not r.resource.plural or "aiohttp" in agent:
                continue
            verb = {"POST": "create", "PATCH": "patch", "DELETE": "delete", "PUT": "update"}.get(
                r.method.value) or ("watch" if r.params.get("watch") == "true"
                                    else "get" if r.name else "list")  # fmt: skip
            resource = r.resource.plural + (f"/{r.subresource}" if r.subresource else "")
            out.add((r.resource.group or "", resource, verb))
        return out

    def sent(self, method: str, path: str = "") -> list[kmock.Request]:
        """Requests received with this method whose path contains `path`."""
        return [r for r in self._requests
                if r.method.value == method and path in r.url.path]  # fmt: skip


async def api(shim: KubeShim, method: str, path: str, body: Any = None,
              content_type: str = "application/json") -> Any:  # fmt: skip
    """One request to the mock as a user would send it (kubectl-like); returns the JSON."""
    import aiohttp

    url = str(shim.url).rstrip("/") + path
    async with aiohttp.ClientSession() as http:
        data = None if body is None else json.dumps(body)
        async with http.request(method, url, data=data,
                                headers={"Content-Type": content_type}) as resp:
            assert resp.status < 300, (method, path, resp.status, await resp.text())
            return await resp.json(content_type=None)


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig at `path` for `server`, as a user's would be (a token nobody checks)."""
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": server}}],
        "users": [{"name": "me", "user": {"token": "not-checked"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "me"}}],
    }))  # fmt: skip
    return path
