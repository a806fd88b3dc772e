"""kopf wiring, and nothing else: which kopf causes call which kvfleet function.

- create / update (of `spec`) / resume -> `reconcile`: apply every child of the pool
  (`runtimes.kubernetes.pool_children.apply_pool`), level-based and idempotent.
  An invalid spec (SpecError, UnservableSpecError) gets Ready=False and Degraded=True with
  reason InvalidSpec naming the field, one Warning event, and `kopf.PermanentError`: no
  retries until the spec changes. An API error is `kopf.TemporaryError`, retried after
  `OperatorConfig.retry_delay_s`.
  After each, the pool's daemon is woken (`memo.wakeups[(namespace, name)]`, an
  `asyncio.Event`): it rebuilds its loop for a changed spec, or starts it once the tokens
  are applied. Nothing polls for a spec change.
- a daemon per pool -> `pool_loop.run_pool`: the one `ControlLoop` over the Kubernetes
  ports, ticking every `min(autoscaling.intervalSeconds, max_tick_s)`. It is a daemon, not
  `@kopf.timer`, because kopf timers have one interval for every object and ours is per
  pool. kopf stops it before the pool goes (that is what its finalizer is for).
- two indexes, `pool_deployments` (engine Deployments) and `pool_pods` (engine and router
  pods), keyed by (namespace, pool), over objects labelled
  `app.kubernetes.io/part-of=kvfleet` with a `kvfleet.io/pool` label (the same selectors go
  to the API server with kopf's list and watch): the loops read their replicas from them
  (`ports/pool_index.py`) instead of listing every tick. kopf fills them before any pool
  handler runs.
- startup: kopf's progress and diff-base storage use the `kvfleet.io` prefix, its finalizer
  is `kvfleet.io/finalizer`; handlers return None, so kopf writes nothing into status.

Everything a handler needs comes through kopf's `memo`: `memo.client` (a `KubeClient`,
made at startup unless given), `memo.config` (an `OperatorConfig`), `memo.metrics`
(every pool's loop series, served on `config.metrics_port` when set),
`memo.admin_tokens` (the router admin token each reconcile applied: a pool's loop starts
as soon as its reconcile is done, without polling its Secret) and `memo.wakeups`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from kvfleet_operator.api.errors import SpecError
from kvfleet_operator.api.pool import GROUP, PLURAL, VERSION
from kvfleet_operator.loop import events as ev
from kvfleet_operator.runtimes import metrics_server
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.operator_config import OperatorConfig
from kvfleet_operator.runtimes.kubernetes.operator_metrics import OperatorMetrics
from kvfleet_operator.runtimes.kubernetes.pool_loop import pool_from_body, run_pool
from kvfleet_operator.runtimes.kubernetes.ports.event_sink import post_event
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import (
    ApiError,
    CredentialsError,
    KubeClient,
    load_configuration,
)
from kvfleet_operator.runtimes.kubernetes.ports.pool_children import apply_pool
from kvfleet_operator.runtimes.kubernetes.ports.pool_index import (
    DEPLOYMENT_SELECTOR,
    PART_OF_LABEL,
    POD_SELECTOR,
    PoolIndexes,
    index_key,
    is_engine,
    slim_deployment,
    slim_pod,
)
from kvfleet_operator.runtimes.kubernetes.ports.status_store import (
    LOOP_STATE_ANNOTATION,
    write_invalid_spec,
)

PREFIX = "kvfleet.io"
FINALIZER = f"{PREFIX}/finalizer"
RESOURCE = (GROUP, VERSION, PLURAL)
INVALID_SPEC_EVENT = "InvalidSpec"
APPLY_FAILED_EVENT = "ApplyFailed"
METRICS_HOST = "0.0.0.0"  # noqa: S104 - Prometheus scrapes the operator's pod
CANCEL_BACKOFF_S = 5.0  # a stopping loop finishes its tick (its `stopped` flag) before a cancel
DEPLOYMENTS = ("apps", "v1", "deployments")
PODS = ("", "v1", "pods")
POD_LABELS: dict[str, Any] = {PART_OF_LABEL: meta.PART_OF, meta.POOL_LABEL: kopf.PRESENT}
DEPLOYMENT_LABELS: dict[str, Any] = {**POD_LABELS, meta.COMPONENT_LABEL: meta.ENGINE}


def configure(settings: kopf.OperatorSettings) -> None:
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PREFIX, key="last-handled-configuration",
        ignored_fields=[("metadata", "annotations", LOOP_STATE_ANNOTATION)],
    )  # fmt: skip
    settings.persistence.finalizer = FINALIZER
    settings.posting.level = logging.WARNING  # our own events say what happened
    # kvfleet's pool children only, filtered by the API server (and by kopf, for kmock)
    settings.watching.label_selectors[DEPLOYMENTS] = DEPLOYMENT_SELECTOR
    settings.watching.label_selectors[PODS] = POD_SELECTOR


def wakeup_of(memo: Any, key: tuple[str, str]) -> asyncio.Event:
    wakeup: asyncio.Event = memo.wakeups.setdefault(key, asyncio.Event())
    return wakeup


def pool_key(body: Mapping[str, Any]) -> tuple[str, str]:
    metadata = body.get("metadata") or {}
    return str(metadata.get("namespace") or "default"), str(metadata.get("name"))


async def report_invalid(client: KubeClient, body: Any, error: SpecError) -> None:
    metadata = body.get("metadata") or {}
    await write_invalid_spec(client, body, error)
    await post_event(client, str(metadata.get("name")), str(metadata.get("namespace") or
                     "default"), str(metadata.get("uid") or ""),
                     ev.warning(INVALID_SPEC_EVENT, str(error)))  # fmt: skip


async def reconcile(body: Any, memo: Any) -> None:
    client: KubeClient = memo.client
    config: OperatorConfig = memo.config
    try:
        pool = pool_from_body(body)
        tokens = await apply_pool(client, pool, image=config.image, options=config.options)
        memo.admin_tokens[(pool.namespace, pool.name)] = tokens.admin
    except SpecError as exc:
        try:
            await report_invalid(client, body, exc)
        except ApiError as api:
            raise kopf.TemporaryError(f"invalid spec ({exc}); reporting it failed: {api}",
                                      delay=config.retry_delay_s) from None  # fmt: skip
        raise kopf.PermanentError(f"invalid spec: {exc}") from None
    except ApiError as exc:
        metadata = body.get("metadata") or {}
        try:
            await post_event(client, str(metadata.get("name")),
                             str(metadata.get("namespace") or "default"),
                             str(metadata.get("uid") or ""),
                             ev.warning(APPLY_FAILED_EVENT, f"applying children: {exc}"))
        except ApiError:
            pass
        raise kopf.TemporaryError(f"applying children failed: {exc}",
                                  delay=config.retry_delay_s) from None  # fmt: skip


def register(
    registry: kopf.OperatorRegistry, *, login: Callable[..., Any] | None = kopf.login_via_client
) -> kopf.OperatorRegistry:
    """Put kvfleet's handlers into `registry` (tests pass their own login)."""

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: Any, **_: Any) -> None:
        configure(settings)
        if memo.get("config") is None:
            memo.config = OperatorConfig()
        if memo.get("client") is None:
            try:
                memo.client = KubeClient(await load_configuration())
            except CredentialsError as exc:
                raise kopf.PermanentError(str(exc)) from None
            memo.owns_client = True
        memo.metrics = OperatorMetrics()
        memo.admin_tokens = {}  # (namespace, pool) -> the admin token the last reconcile applied
        memo.wakeups = {}  # (namespace, pool) -> its daemon's wake-up (set after a reconcile)
        if memo.config.metrics_port is not None:
            try:
                memo.metrics_runner, memo.metrics_port = await metrics_server.start(
                    memo.metrics, METRICS_HOST, memo.config.metrics_port)
            except OSError as exc:  # retrying cannot free a port someone else holds
                raise kopf.PermanentError(
                    f"--metrics-port {memo.config.metrics_port}: cannot listen on "
                    f"{METRICS_HOST}: {exc.strerror or exc}") from None

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: Any, **_: Any) -> None:
        if memo.get("metrics_runner") is not None:
            await memo.metrics_runner.cleanup()
        if memo.get("owns_client"):
            await memo.client.close()

    if login is not None:
        kopf.on.login(registry=registry)(login)

    @kopf.on.resume(*RESOURCE, registry=registry, id="reconcile-resume")
    @kopf.on.create(*RESOURCE, registry=registry, id="reconcile-create")
    @kopf.on.update(*RESOURCE, registry=registry, id="reconcile-update", field="spec")
    async def on_change(body: Any, memo: Any, **_: Any) -> None:
        try:
            await reconcile(body, memo)
        finally:  # whatever came of it, the loop follows the spec kopf has just seen
            wakeup_of(memo, pool_key(body)).set()

    @kopf.index(*DEPLOYMENTS, registry=registry, id="pool_deployments",
                labels=DEPLOYMENT_LABELS)  # fmt: skip
    def pool_deployments(body: Any, namespace: Any, labels: Any, **_: Any) -> Any:
        key = index_key(namespace, labels)
        return {key: slim_deployment(body)} if key is not None and is_engine(body) else None

    @kopf.index(*PODS, registry=registry, id="pool_pods", labels=POD_LABELS)
    def pool_pods(body: Any, namespace: Any, labels: Any, **_: Any) -> Any:
        key = index_key(namespace, labels)
        return {key: slim_pod(body)} if key is not None else None

    @kopf.daemon(*RESOURCE, registry=registry, id="control-loop",
                 cancellation_backoff=CANCEL_BACKOFF_S, cancellation_timeout=10.0)
    async def control_loop(body: Any, memo: Any, stopped: Any, **kwargs: Any) -> None:
        key = pool_key(body)
        indexes = PoolIndexes(deployments=kwargs["pool_deployments"], pods=kwargs["pool_pods"])
        try:
            await run_pool(body, memo.client, memo.config, stopped, indexes,
                           wakeup_of(memo, key), memo.metrics,
                           applied_tokens=memo.admin_tokens)  # fmt: skip
        finally:
            memo.wakeups.pop(key, None)

    return registry
