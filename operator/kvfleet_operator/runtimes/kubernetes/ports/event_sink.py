"""The loop's `EventSink` port on Kubernetes: core/v1 Events on the pool.

`emit` is synchronous (the loop calls it anywhere); events queue up and one task posts
them, so `kubectl describe inferencepool` and `kubectl get events` show them. A full queue
or a failed post drops the event (and logs it): events are advisory, never a reason to stall
the loop.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from datetime import UTC, datetime

from kvfleet_operator.api.pool import API_VERSION, KIND, InferencePool
from kvfleet_operator.api.status import rfc3339
from kvfleet_operator.loop.events import Event
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import (
    ApiError,
    KubeClient,
    collection_path,
)

log = logging.getLogger(__name__)
COMPONENT = "kvfleet-operator"
MAX_QUEUED = 1000
MAX_MESSAGE = 1024


def event_body(
    name: str, namespace: str, uid: str, event: Event, now: datetime
) -> dict[str, object]:
    """A core/v1 Event about pool `name`."""
    stamp = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{name}.", "namespace": namespace},
        "involvedObject": {"apiVersion": API_VERSION, "kind": KIND, "name": name,
                           "namespace": namespace, "uid": uid},
        "type": event.type,
        "reason": event.reason,
        "message": event.message[:MAX_MESSAGE],
        "source": {"component": COMPONENT},
        "reportingComponent": f"kvfleet.io/{COMPONENT}",
        "reportingInstance": socket.gethostname()[:128],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


async def post_event(client: KubeClient, name: str, namespace: str, uid: str, event: Event) -> None:
    path = collection_path("v1", "Event", namespace)
    await client.post(path, event_body(name, namespace, uid, event, datetime.now(UTC)))


class KubeEventSink:
    def __init__(self, client: KubeClient, pool: InferencePool) -> None:
        self.client = client
        self.pool = pool
        self._queue: asyncio.Queue[Event] = asyncio.Queue(MAX_QUEUED)
        self._task: asyncio.Task[None] | None = None

    def emit(self, event: Event) -> None:
        try:
            self._queue.put_nowait(event)
        except asyncio.QueueFull:
            log.warning("event dropped (queue full): %s %s", event.reason, event.message)
            return
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._drain())

    async def _drain(self) -> None:
        while not self._queue.empty():
            event = self._queue.get_nowait()
            pool = self.pool
            try:
                await post_event(self.client, pool.name, pool.namespace, pool.uid or "", event)
            except (ApiError, OSError, TimeoutError) as exc:
                log.warning("event not posted (%s): %s %s", exc, event.reason, event.message)

    async def aclose(self) -> None:
        """Post what is queued (the pool is going away or the operator stops)."""
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
