"""kopf's two indexes (`handlers.py`: `pool_deployments`, `pool_pods`) for tests that run
the Kubernetes ports without kopf: `live(cluster)` reads the mock at each lookup (a watch
that never lags), `snapshot(cluster)` keeps what the mock held when it was taken (a watch
that has not delivered anything since)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from kvfleet_operator.runtimes.kubernetes.ports.pool_index import (
    Key,
    PoolIndexes,
    index_key,
    is_engine,
    slim_deployment,
    slim_pod,
)

DEPLOYMENTS = "apps/v1/deployments"
PODS = "v1/pods"


def _indexed(cluster, resource: str, slim: Callable[[Any], dict], only: Callable[[Any], bool]
             ) -> dict[Key, list[dict]]:  # fmt: skip
    out: dict[Key, list[dict]] = {}
    for obj in cluster.objs(resource):
        metadata = obj.get("metadata") or {}
        key = index_key(metadata.get("namespace"), metadata.get("labels") or {})
        if key is not None and only(obj):
            out.setdefault(key, []).append(slim(obj))
    return out


class LiveIndex(Mapping[Key, list[dict]]):
    def __init__(self, cluster, resource: str, slim: Callable[[Any], dict],
                 only: Callable[[Any], bool] = lambda _: True) -> None:  # fmt: skip
        self._read = lambda: _indexed(cluster, resource, slim, only)

    def __getitem__(self, key: Key) -> list[dict]:
        return self._read()[key]

    def __iter__(self) -> Iterator[Key]:
        return iter(self._read())

    def __len__(self) -> int:
        return len(self._read())


def live(cluster) -> PoolIndexes:
    return PoolIndexes(deployments=LiveIndex(cluster, DEPLOYMENTS, slim_deployment, is_engine),
                       pods=LiveIndex(cluster, PODS, slim_pod))


def snapshot(cluster) -> PoolIndexes:
    deployments: Mapping[Key, list[dict]] = _indexed(cluster, DEPLOYMENTS, slim_deployment,
                                                     is_engine)  # fmt: skip
    return PoolIndexes(deployments=deployments, pods=_indexed(cluster, PODS, slim_pod,
                                                              lambda _: True))  # fmt: skip
