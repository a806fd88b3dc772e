"""The loop's `StateStore` port on Kubernetes: the pool's own status, and its loop state.

- Status goes to the `status` subresource as a JSON merge patch computed against what was
  last written (`merge_diff`): keys that went away are sent as null, and lists, above all
  `conditions`, are always sent whole (merge patches replace lists). Nothing is written when
  nothing changed, so a quiet pool costs no writes.
- The loop state (desired counts, autoscaler history, drain start times, the last router
  config every router accepted) is JSON in the annotation `kvfleet.io/loop-state`, written
  only when it changed. The CRD's status schema has no room for it (the apiserver would
  prune it) and kopf ignores `kvfleet.io/` annotations in its diffs (our storage prefix),
  so writing it never triggers a handler. A restarted operator reads both back from the
  pool: no scale jump, drain timers keep running.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kvfleet_operator.api.errors import SpecError
from kvfleet_operator.api.pool import API_VERSION, KIND, InferencePool
from kvfleet_operator.api.status import ConditionType, PoolStatus, Reason, parse_status
from kvfleet_operator.decide.reconcile import invalid_spec_status
from kvfleet_operator.loop import events as ev
from kvfleet_operator.loop.ports import EventSink, Saved
from kvfleet_operator.loop.state import LoopState
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.placement import ROUTER_PORT
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import ApiError, KubeClient, object_path

LOOP_STATE_ANNOTATION = "kvfleet.io/loop-state"


def merge_diff(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`."""
    patch: dict[str, Any] = {}
    for key in old.keys() - new.keys():
        patch[key] = None
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            sub = merge_diff(before, value)
            if sub:
                patch[key] = sub
        elif key not in old or before != value:
            patch[key] = value
    return patch


def pool_path(pool: InferencePool) -> str:
    return object_path(API_VERSION, KIND, pool.namespace, pool.name)


def endpoint(pool: InferencePool) -> str:
    return f"http://{meta.router_name(pool)}.{pool.namespace}.svc:{ROUTER_PORT}/v1"


def saved_from_body(body: Mapping[str, Any]) -> Saved | None:
    """What an earlier operator run left on the pool; junk loop state starts afresh."""
    annotations = (body.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(LOOP_STATE_ANNOTATION)
    status = body.get("status")
    if raw is None and not status:
        return None
    try:
        loop = LoopState.from_dict(json.loads(raw)) if raw else LoopState()
    except ValueError:
        loop = LoopState()
    return Saved(parse_status(status), loop)


def status_dict(status: PoolStatus) -> dict[str, Any]:
    return {k: v for k, v in status.to_dict().items() if v is not None}


async def write_status(
    client: KubeClient, path: str, old: Mapping[str, Any], new: dict[str, Any]
) -> bool:
    """Merge-patch `path`'s status from `old` to `new`; False when nothing changed."""
    patch = merge_diff(old, new)
    if not patch:
        return False
    if "conditions" in new:
        patch["conditions"] = new["conditions"]  # always whole: a merge patch replaces lists
    await client.merge_patch(path + "/status", {"status": patch})
    return True


def is_invalid_spec_reported(body: Mapping[str, Any]) -> bool:
    conditions = (body.get("status") or {}).get("conditions") or []
    return any(c.get("type") == ConditionType.DEGRADED and c.get("reason") == Reason.INVALID_SPEC
               for c in conditions if isinstance(c, Mapping))  # fmt: skip


async def write_invalid_spec(client: KubeClient, body: Mapping[str, Any], error: SpecError) -> None:
    """Ready=False, Degraded=True with reason InvalidSpec naming the field, for the body's
    generation (`reconcile.invalid_spec_status`)."""
    metadata = body.get("metadata") or {}
    old = parse_status(body.get("status"))
    generation = metadata.get("generation")
    old.observed_generation = generation if isinstance(generation, int) else 0
    new = invalid_spec_status(old, error, datetime.now(UTC))
    path = object_path(API_VERSION, KIND, str(metadata.get("namespace") or "default"),
                       str(metadata.get("name")))  # fmt: skip
    await write_status(client, path, dict(body.get("status") or {}), status_dict(new))


class PoolStatusStore:
    def __init__(
        self, client: KubeClient, pool: InferencePool, body: Mapping[str, Any],
        events: EventSink,
    ) -> None:  # fmt: skip
        self.client = client
        self.pool = pool
        self.events = events
        self._saved = saved_from_body(body)
        self._status: dict[str, Any] = dict(body.get("status") or {})
        annotations = (body.get("metadata") or {}).get("annotations") or {}
        self._loop_json: str | None = annotations.get(LOOP_STATE_ANNOTATION)
        self._last_error = ""

    def load(self) -> Saved | None:
        return self._saved

    async def save(self, status: PoolStatus, loop: LoopState, view: dict[str, Any]) -> None:
        status.endpoint = endpoint(self.pool)
        new = status_dict(status)
        loop_json = json.dumps(loop.to_dict(), sort_keys=True, separators=(",", ":"))
        try:
            if await write_status(self.client, pool_path(self.pool), self._status, new):
                self._status = new
            if loop_json != self._loop_json:
                await self.client.merge_patch(pool_path(self.pool), {
                    "metadata": {"annotations": {LOOP_STATE_ANNOTATION: loop_json}}})
                self._loop_json = loop_json
        except ApiError as exc:
            message = f"cannot write the pool's status: {exc}"
            if message != self._last_error:
                self.events.emit(ev.warning(ev.EventReason.STATE_WRITE_FAILED, message))
            self._last_error = message
            return
        self._last_error = ""
        self._saved = Saved(status, loop)
