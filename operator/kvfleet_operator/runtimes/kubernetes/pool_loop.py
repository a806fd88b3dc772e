"""One pool's control loop on Kubernetes: the Kubernetes ports around the one
`ControlLoop`, run until the pool goes away (kopf stops the daemon) or its spec changes
(then the loop is rebuilt for the new spec, carrying its state over through the store).

Nothing here polls. The loop reads the pool's Deployments and Pods from kopf's indexes
(`ports/pool_index.py`); the daemon sleeps until one of: kopf stops it, its loop ends, or
the reconcile handler wakes it (`wakeup`, an `asyncio.Event` per pool in kopf's memo, set
after every create/update/resume of the pool). On a wake-up it rebuilds the loop when the
spec or the generation changed (so `status.observedGeneration` follows the spec), and
starts the loop once the handler has applied the pool's tokens.

The pool's `kvfleet.io/rollout-promote: <revision>` annotation is handed to the loop before
every tick (`ControlLoop.promote_revision`): a canary or blue-green rollout of that revision
skips its remaining steps.

`pool_from_body` is the one place a kopf body becomes an `InferencePool`.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Awaitable, Mapping, MutableMapping
from typing import Any, Protocol

import aiohttp

from kvfleet_operator.api.errors import SpecError
from kvfleet_operator.api.pool import PROMOTE_ANNOTATION, InferencePool, parse_pool
from kvfleet_operator.loop.control_loop import ControlLoop, LoopTiming
from kvfleet_operator.loop.events import Fanout
from kvfleet_operator.loop.ports import MetricsSource
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.children import build_children
from kvfleet_operator.runtimes.kubernetes.build.options import Tokens
from kvfleet_operator.runtimes.kubernetes.build.service import router_peers_dns
from kvfleet_operator.runtimes.kubernetes.operator_config import OperatorConfig
from kvfleet_operator.runtimes.kubernetes.operator_metrics import OperatorMetrics
from kvfleet_operator.runtimes.kubernetes.ports.event_sink import KubeEventSink
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import ApiError, KubeClient
from kvfleet_operator.runtimes.kubernetes.ports.pool_index import OwnWrites, PoolIndexes
from kvfleet_operator.runtimes.kubernetes.ports.replica_runtime import KubeReplicaRuntime
from kvfleet_operator.runtimes.kubernetes.ports.router_ports import PodRouterControl
from kvfleet_operator.runtimes.kubernetes.ports.status_store import (
    PoolStatusStore,
    is_invalid_spec_reported,
    write_invalid_spec,
)
from kvfleet_operator.runtimes.kubernetes.ports.tokens import read_token
from kvfleet_operator.runtimes.metrics_sources import PrometheusMetrics, ScrapeMetrics

CHECK_TOKENS = Tokens(admin="only-to-check-the-spec", engine="only-to-check-the-spec")
REPORT_GRACE_S = 2.0  # after this, an invalid spec not shown in status is written again


def pool_from_body(body: Mapping[str, Any]) -> InferencePool:
    """Raises SpecError naming the field."""
    return parse_pool(copy.deepcopy(dict(body)))


def promote_revision(body: Mapping[str, Any]) -> str | None:
    """The revision the pool's `kvfleet.io/rollout-promote` annotation promotes by hand, or
    None. Read from kopf's live body before every tick: annotating the pool changes no spec,
    so it rebuilds nothing (the `InferencePool` the loop was built from keeps the
    annotations it had then)."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    value = str(annotations.get(PROMOTE_ANNOTATION) or "").strip()
    return value or None


def servable_pool(body: Mapping[str, Any], config: OperatorConfig) -> InferencePool:
    """The pool, if this runtime can run it: it parses and its children build (pure).
    Raises SpecError (UnservableSpec included) naming the field, as the handler does."""
    pool = pool_from_body(body)
    build_children(pool, tokens=CHECK_TOKENS, image=config.image, options=config.options)
    return pool


class Stopped(Protocol):
    """kopf's `stopped` flag for a daemon (an `asyncio.Event` in tests)."""

    def is_set(self) -> bool: ...
    def wait(self) -> Awaitable[Any]: ...


def built_from(body: Mapping[str, Any]) -> tuple[Any, Any]:
    """What a loop is built from: a change of either rebuilds it."""
    return (body.get("metadata") or {}).get("generation"), copy.deepcopy(body.get("spec"))


def metrics_source(
    session: aiohttp.ClientSession, pool: InferencePool, config: OperatorConfig
) -> MetricsSource:
    if config.prometheus_url:
        selector = f'namespace="{pool.namespace}",pod=~"{pool.name}-.*"'
        return PrometheusMetrics(session, config.prometheus_url, selector, replica_label="pod")
    return ScrapeMetrics(session)


async def _until(
    wakeup: asyncio.Event, stopped: Stopped, timeout_s: float | None = None,
    task: asyncio.Task[Any] | None = None,
) -> None:  # fmt: skip
    """Sleep until `wakeup` is set, kopf stops us, `task` ends or `timeout_s` passes."""
    if wakeup.is_set() or stopped.is_set() or (task is not None and task.done()):
        return
    waits: set[asyncio.Future[Any]] = {asyncio.ensure_future(wakeup.wait()),
                                      asyncio.ensure_future(stopped.wait())}  # fmt: skip
    try:
        await asyncio.wait(waits | ({task} if task is not None else set()),
                           timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
    finally:
        for waiter in waits:
            waiter.cancel()


async def run_pool(
    body: Mapping[str, Any], client: KubeClient, config: OperatorConfig, stopped: Stopped,
    indexes: PoolIndexes, wakeup: asyncio.Event, metrics: OperatorMetrics | None = None,
    applied_tokens: MutableMapping[tuple[str, str], str] | None = None,
) -> None:  # fmt: skip
    """`body` is kopf's live view of the pool (it follows the object as it changes);
    `indexes`, kopf's live indexes of every pool's Deployments and Pods; `wakeup`, set by
    the reconcile handler after each create/update/resume; `metrics`, when given, gets this
    pool's series while its loop runs; `applied_tokens`, the admin tokens the reconcile
    handler applied, spares reading the Secret until then."""
    applied = applied_tokens if applied_tokens is not None else {}
    timeout = aiohttp.ClientTimeout(total=5.0)
    own = OwnWrites()  # across rebuilds: the new loop sees what the old one just wrote
    async with aiohttp.ClientSession(timeout=timeout) as session:
        store: PoolStatusStore | None = None
        events: KubeEventSink | None = None
        key: tuple[str, str] | None = None
        while not stopped.is_set():
            wakeup.clear()  # a wake-up from here on is for what we build now, or later
            built = built_from(body)
            try:
                pool = servable_pool(body, config)
            except SpecError as exc:  # the reconcile handler reports it; wait for a new spec
                await _until(wakeup, stopped, REPORT_GRACE_S)
                if not wakeup.is_set() and not stopped.is_set() \
                        and not is_invalid_spec_reported(body):  # fmt: skip
                    try:  # the last tick of the old spec's loop overwrote it
                        await write_invalid_spec(client, body, exc)
                    except ApiError:
                        pass  # the handler's own report stands; kopf retries that one
                await _until(wakeup, stopped)
                continue
            key = (pool.namespace, pool.name)
            token = applied.get(key)
            if token is None:  # after an operator restart: the Secret has it
                try:
                    token = await read_token(client, pool.namespace, meta.admin_secret_name(pool))
                except ApiError:
                    token = None  # the API is having a moment: try again after a tick
            if token is None:  # the reconcile handler has not created it yet: it wakes us
                await _until(wakeup, stopped, config.max_tick_s)
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
                                         indexes=indexes, own_writes=own)  # fmt: skip
            series = metrics.for_pool(pool) if metrics is not None else None
            loop = ControlLoop(
                pool, runtime=runtime,
                router=PodRouterControl(session, runtime.routers, token),
                metrics=metrics_source(session, pool, config), store=store,
                events=events if series is None else Fanout(events, series),
                timing=LoopTiming(tick_s=tick_s),
                router_peers_dns=router_peers_dns(pool),
            )  # fmt: skip

            def observed(loop: ControlLoop = loop, series: Any = series) -> None:
                if series is not None:
                    series.observe_status(loop.pool.status, loop.num_held)
                loop.promote_revision = promote_revision(body)  # for the next tick

            loop.promote_revision = promote_revision(body)

            stop = asyncio.Event()
            task = asyncio.create_task(loop.run(stop, observed))
            try:
                while True:
                    await _until(wakeup, stopped, task=task)
                    if stopped.is_set() or task.done() or built_from(body) != built:
                        break
                    wakeup.clear()  # a reconcile of the same spec (a retry): keep the loop
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
