"""A bounded, priority-ordered wait queue for requests that found every endpoint busy.

Lower priority values go first (vLLM's convention), FIFO within a priority. Only the head
may retry routing; `wake()` (on a finished request, a reload or a health change) lets it.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools


class QueueFull(Exception):
    pass


class WaitQueue:
    def __init__(self, max_size: int) -> None:
        self.max_size = max_size
        self._heap: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def enter(self, priority: int) -> asyncio.Future[None]:
        if len(self._heap) >= self.max_size:
            raise QueueFull
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._heap, (priority, next(self._seq), fut))
        return fut

    def is_head(self, fut: asyncio.Future[None]) -> bool:
        return bool(self._heap) and self._heap[0][2] is fut

    def leave(self, fut: asyncio.Future[None]) -> None:
        for i, item in enumerate(self._heap):
            if item[2] is fut:
                self._heap.pop(i)
                heapq.heapify(self._heap)
                break
        self.wake()

    def wake(self) -> None:
        if self._heap:
            fut = self._heap[0][2]
            if not fut.done():
                fut.set_result(None)

    def rearm(self, fut: asyncio.Future[None]) -> asyncio.Future[None]:
        """Replace a woken waiter's future in place (keeps its position)."""
        for i, (prio, seq, f) in enumerate(self._heap):
            if f is fut:
                new: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                self._heap[i] = (prio, seq, new)
                return new
        raise KeyError("waiter not in queue")
