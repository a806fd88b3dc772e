"""The operator's `/metrics` (`kvfleet operator run --metrics-port`): every pool's
`loop.metrics.LoopMetrics` (the same series `kvfleet up` serves, `pool` = `NS/NAME`), merged
into one exposition, so one scrape of the operator covers all its pools."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.loop.metrics import LoopMetrics


def pool_key(pool: InferencePool) -> str:
    return f"{pool.namespace}/{pool.name}"


class OperatorMetrics(Collector):
    def __init__(self) -> None:
        self.pools: dict[str, LoopMetrics] = {}
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def for_pool(self, pool: InferencePool) -> LoopMetrics:
        """This pool's metrics, made afresh for its current spec."""
        metrics = LoopMetrics(pool_key(pool), pool.spec)
        self.pools[pool_key(pool)] = metrics
        return metrics

    def forget(self, pool: InferencePool) -> None:
        self.pools.pop(pool_key(pool), None)

    def collect(self) -> Iterator[Metric]:
        merged: dict[str, Metric] = {}
        for metrics in list(self.pools.values()):
            for family in metrics.registry.collect():
                have = merged.get(family.name)
                if have is None:
                    have = merged[family.name] = Metric(family.name, family.documentation,
                                                        family.type, family.unit)
                have.samples.extend(family.samples)
        yield from merged.values()

    def render(self) -> bytes:
        return generate_latest(self.registry)
