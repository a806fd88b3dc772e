"""One pool's control loop on Kubernetes: the Kubernetes ports around the one
`ControlLoop`, run until the pool goes away (kopf stops the daemon) or its spec changes
(then the loop is rebuilt for the new spec, carrying its state over through the store).

`pool_from_body` is the one place a kopf body becomes an `InferencePool`.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any

import aiohttp

from kvfleet_operator.api.errors import SpecError
from kvfleet_operator.api.pool import InferencePool, parse_pool
from kvfleet_operator.loop.control_loop import ControlLoop, LoopTiming
from kvfleet_operator.loop.events import Fanout
from kvfleet_operator.loop.ports import MetricsSource
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.children import build_children
from kvfleet_operator.runtimes.kubernetes.build.options import Tokens
from kvfleet_operator.runtimes.kubernetes.operator_config import OperatorConfig
from kvfleet_operator.runtimes.kubernetes.operator_metrics import OperatorMetrics
from kvfleet_operator.runtimes.kubernetes.ports.event_sink import KubeEventSink
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import ApiError, KubeClient
from kvfleet_operator.runtimes.kubernetes.ports.replica_runtime import KubeReplicaRuntime
from kvfleet_operator.runtimes.kubernetes.ports.router_ports import PodRouterControl
from kvfleet_operator.runtimes.kubernetes.ports.status_store import (
    PoolStatusStore,
    is_invalid_spec_reported,
    write_invalid_spec,
)
from kvfleet_operator.runtimes.kubernetes.ports.tokens import read_token
from kvfleet_operator.runtimes.metrics_sources import PrometheusMetrics, ScrapeMetrics

POLL_S = 1.0  # how soon a loop sees its spec change (the reconcile handler applies it at once)
CHECK_TOKENS = Tokens(admin="only-to-check-the-spec", engine="only-to-check-the-spec")
REPORT_GRACE_S = 2.0  # after this, an invalid spec not shown in status is written again


def pool_from_body(body: Mapping[str, Any]) -> InferencePool:
    """Raises SpecError naming the field."""
    return parse_pool(copy.deepcopy(dict(body)))


def servable_pool(body: Mapping[str, Any], config: OperatorConfig) -> InferencePool:
    """The pool, if this runtime can run it: it parses and its children build (pure).
    Raises SpecError (UnservableSpec included) naming the field, as the handler does."""
    pool = pool_from_body(body)
    build_children(pool, tokens=CHECK_TOKENS, image=config.image, options=config.options)
    return pool


def generation_of(body: Mapping[str, Any]) -> Any:
    return (body.get("metadata") or {}).get("generation")


def metrics_source(
    session: aiohttp.ClientSession, pool: InferencePool, config: OperatorConfig
) -> MetricsSource:
    if config.prometheus_url:
        selector = f'namespace="{pool.namespace}",pod=~"{pool.name}-.*"'
        return PrometheusMetrics(session, config.prometheus_url, selector, replica_label="pod")
    return ScrapeMetrics(session)


async def _sleep_until(
    done: Callable[[], bool], timeout_s: float | None = None,
    task: asyncio.Task[Any] | None = None,
) -> None:  # fmt: skip
    """Until `done()` (checked every POLL_S), `task` ends, or `timeout_s` passes. Each of a
    thousand pools polls, so the poll is slow; a loop that ends wakes us at once."""
    waited = 0.0
    while not done() and (timeout_s is None or waited < timeout_s):
        step = POLL_S if timeout_s is None else min(POLL_S, timeout_s - waited)
        if task is not None:
            await asyncio.wait({task}, timeout=step)
            if task.done():
                return
        else:
            await asyncio.sleep(step)
        waited += step


async def run_pool(
    body: Mapping[str, Any], client: KubeClient, config: OperatorConfig,
    stopped: Callable[[], bool], metrics: OperatorMetrics | None = None,
    applied_tokens: MutableMapping[tuple[str, str], str] | None = None,
) -> None:  # fmt: skip
    """`body` is kopf's live view of the pool (it follows the object as it changes);
    `metrics`, when given, gets this pool's series while its loop runs; `applied_tokens`,
    the admin tokens the reconcile handler applied, spares polling the Secret until then."""
    applied = applied_tokens if applied_tokens is not None else {}
    timeout = aiohttp.ClientTimeout(total=5.0)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        store: PoolStatusStore | None = None
        events: KubeEventSink | None = None
        key: tuple[str, str] | None = None
        while not stopped():
            generation = generation_of(body)

            def changed(generation: Any = generation) -> bool:
                return stopped() or generation_of(body) != generation

            try:
                pool = servable_pool(body, config)
            except SpecError as exc:  # the reconcile handler reports it; wait for a new spec
                await _sleep_until(changed, REPORT_GRACE_S)
                if not changed() and not is_invalid_spec_reported(body):
                    try:  # the last tick of the old spec's loop overwrote it
                        await write_invalid_spec(client, body, exc)
                    except ApiError:
                        pass  # the handler's own report stands; kopf retries that one
                await _sleep_until(changed)
                continue
            key = (pool.namespace, pool.name)
            token = applied.get(key)
            if token is None:  # after an operator restart: the Secret has it
                try:
                    token = await read_token(client, pool.namespace, meta.admin_secret_name(pool))
                except ApiError:
                    token = None  # the API is having a moment: try again next tick
            if token is None:  # the reconcile handler has not created it yet
                await _sleep_until(lambda k=key: changed() or k in applied,  # type: ignore[misc]
                                   config.max_tick_s)  # fmt: skip
                continue
            if events is None:
                events = KubeEventSink(client, pool)
            events.pool = pool
            if store is None:
                store = PoolStatusStore(client, pool, body, events)
            store.pool = pool
            tick_s = min(float(pool.spec.autoscaling.interval_seconds), config.max_tick_s)
            runtime = KubeReplicaRuntime(client, pool, image=config.image,
                                         options=config.options, events=events,
                                         list_max_age_s=min(config.list_cache_s, tick_s / 2))
            series = metrics.for_pool(pool) if metrics is not None else None
            loop = ControlLoop(
                pool, runtime=runtime,
                router=PodRouterControl(session, runtime.routers, token),
                metrics=metrics_source(session, pool, config), store=store,
                events=events if series is None else Fanout(events, series),
                timing=LoopTiming(tick_s=tick_s),
            )  # fmt: skip

            def observed(loop: ControlLoop = loop, series: Any = series) -> None:
                if series is not None:
                    series.observe_status(loop.pool.status, loop.num_held)

            stop = asyncio.Event()
            task = asyncio.create_task(loop.run(stop, observed))
            try:
                await _sleep_until(changed, task=task)
                stop.set()
                await task
            finally:  # cancelled by kopf: the loop goes with us, never orphaned
                task.cancel()
        if key is not None:
            applied.pop(key, None)
        if events is not None:
            await events.aclose()
            if metrics is not None:
                metrics.forget(events.pool)
