"""The Deployments and Pods each pool owns, as kopf's watches stream them, and the loop's
own writes until those streams show them.

- `handlers.py` registers two `@kopf.index`es over objects labelled
  `app.kubernetes.io/part-of=kvfleet` with a `kvfleet.io/pool` label (the label selector is
  also sent to the API server, so other pods never reach the operator): engine Deployments
  and every pod (engines, routers), keyed by `(namespace, pool)`. Each value is a slim copy
  (`slim_deployment`, `slim_pod`): only the fields `pods.py` reads, so 1,000 pools' objects
  cost little memory. kopf fills the indexes before any pool handler runs and keeps them
  current from its watches; a daemon gets them as live views.
- `PoolIndexes` is what `KubeReplicaRuntime` reads each tick instead of listing: no API
  call per tick. Anything with `.get(key, default)` returning an iterable of objects works
  (kopf's `Index`, a dict in tests).
- `OwnWrites` is read-your-writes: the answer to each write (a PATCH returns the object as
  written, with its resourceVersion) stands in for the indexed object until the index shows
  that version or a later one, so a loop that just scaled a Deployment or marked a pod never
  acts again on the view from before its write. An entry the index never confirms (the
  object went away meanwhile) is dropped after `MAX_LAG_S`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from kvfleet_operator.runtimes.kubernetes.build.meta import (
    COMPONENT_LABEL,
    ENGINE,
    PART_OF,
    POOL_LABEL,
)

PART_OF_LABEL = "app.kubernetes.io/part-of"
# Sent with kopf's list and watch of Pods and Deployments (kopf's `label_selectors`).
POD_SELECTOR = f"{PART_OF_LABEL}={PART_OF},{POOL_LABEL}"
DEPLOYMENT_SELECTOR = f"{POD_SELECTOR},{COMPONENT_LABEL}={ENGINE}"  # routers' are not read
MAX_LAG_S = 60.0  # an own write the index has not shown by then is forgotten
_METADATA = ("name", "namespace", "labels", "annotations", "resourceVersion",
             "creationTimestamp", "deletionTimestamp")  # fmt: skip

Key = tuple[str, str]  # (namespace, pool)


class Index(Protocol):
    def get(self, key: Key, default: Any = None, /) -> Iterable[Mapping[str, Any]] | None: ...


def index_key(namespace: str | None, labels: Mapping[str, str]) -> Key | None:
    """The pool an object belongs to, or None (not one of kvfleet's pool children)."""
    pool = labels.get(POOL_LABEL)
    if not pool or labels.get(PART_OF_LABEL) != PART_OF:
        return None
    return (str(namespace or "default"), str(pool))


def is_engine(obj: Mapping[str, Any]) -> bool:
    return ((obj.get("metadata") or {}).get("labels") or {}).get(COMPONENT_LABEL) == ENGINE


def _slim_meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    metadata = obj.get("metadata") or {}
    return {k: metadata[k] for k in _METADATA if metadata.get(k) is not None}


def slim_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """What `pods.py` reads of a pod: metadata, the readiness gates, the whole status."""
    gates = (pod.get("spec") or {}).get("readinessGates")
    return {"metadata": _slim_meta(pod), "spec": {"readinessGates": gates} if gates else {},
            "status": dict(pod.get("status") or {})}  # fmt: skip


def slim_deployment(deployment: Mapping[str, Any]) -> dict[str, Any]:
    """What the runtime reads of a Deployment: `spec.replicas` and the template's
    annotations (its `kvfleet.io/template-hash`)."""
    spec = deployment.get("spec") or {}
    template = ((spec.get("template") or {}).get("metadata") or {}).get("annotations")
    out: dict[str, Any] = {"replicas": spec.get("replicas")}
    if template:
        out["template"] = {"metadata": {"annotations": template}}
    return {"metadata": _slim_meta(deployment), "spec": out}


def name_of(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def version_of(obj: Mapping[str, Any] | None) -> str | None:
    rv = ((obj or {}).get("metadata") or {}).get("resourceVersion")
    return None if rv is None else str(rv)


@dataclass(frozen=True, slots=True)
class PoolIndexes:
    deployments: Index  # engine Deployments
    pods: Index  # engine and router pods

    def read(self, namespace: str, pool: str) -> tuple[list[dict[str, Any]],
                                                       list[dict[str, Any]]]:  # fmt: skip
        """The pool's engine Deployments and its pods, as the watches last showed them
        (copied out in one go: nothing awaits in between)."""
        key = (namespace, pool)
        return ([dict(d) for d in self.deployments.get(key, None) or ()],
                [dict(p) for p in self.pods.get(key, None) or ()])  # fmt: skip


def is_behind(indexed: str | None, written: str | None, before: str | None) -> bool:
    """Does the index still show a version from before our write? resourceVersions are
    opaque, but the apiserver's are etcd revisions (integers that grow): where both parse,
    compare them; else only the version our write replaced counts as behind."""
    if indexed is None or indexed == written:
        return False
    if indexed == before:
        return True
    try:
        return int(indexed) < int(written or "")
    except ValueError:
        return False


@dataclass(slots=True)
class _Written:
    obj: dict[str, Any]
    before: str | None  # the version our view held when we wrote
    at: float


class OwnWrites:
    """The objects one loop wrote, per (kind, name), until the index catches up."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._written: dict[tuple[str, str], _Written] = {}

    def __len__(self) -> int:
        return len(self._written)

    def remember(
        self, kind: str, answer: Any, before: Mapping[str, Any] | None,
        slim: Callable[[Mapping[str, Any]], dict[str, Any]],
    ) -> dict[str, Any] | None:  # fmt: skip
        """Keep the write's answer (the object as written); returns it slimmed, or None
        when the answer is not the object."""
        if not isinstance(answer, Mapping) or not name_of(answer):
            return None
        key = (kind, name_of(answer))
        earlier = self._written.get(key)
        before_rv = earlier.before if earlier is not None else version_of(before)
        obj = slim(answer)
        self._written[key] = _Written(obj, before_rv, self._clock())
        return obj

    def forget(self, kind: str, name: str) -> None:
        """We deleted it: our earlier writes no longer stand for it."""
        self._written.pop((kind, name), None)

    def view(self, kind: str, indexed: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
        """The index's objects, each replaced by our own write where the index is behind
        it; objects we wrote that the index does not show yet (a create) are added."""
        now = self._clock()
        out: list[dict[str, Any]] = []
        seen: set[str] = set()
        for item in indexed:
            name = name_of(item)
            seen.add(name)
            mine = self._written.get((kind, name))
            if mine is not None and now - mine.at < MAX_LAG_S \
                    and is_behind(version_of(item), version_of(mine.obj), mine.before):  # fmt: skip
                out.append(mine.obj)
                continue
            if mine is not None:
                del self._written[(kind, name)]
            out.append(item)
        for (k, name), mine in list(self._written.items()):
            if k != kind or name in seen:
                continue
            if mine.before is None and now - mine.at < MAX_LAG_S:  # created, not indexed yet
                out.append(mine.obj)
            else:  # gone since we wrote it
                del self._written[(k, name)]
        return out
