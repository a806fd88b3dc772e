"""The engine's own thread: every engine call (and so every forward pass) runs here.

asyncio handlers never touch the engine. They put commands on a thread-safe queue;
the thread runs them between steps and hands outputs, errors, stats snapshots and
KV events back to the event loop with `call_soon_threadsafe`, one batch per step.

The one exception is `read`: a read-only look at the engine (a peer's export of cached
blocks) that need not wait for a step to end. The thread holds a bookkeeping lock except
while a forward pass computes or the queue is idle, and `read` runs under that lock on a
worker thread, so it sees the block tables between two changes, never during one.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

Command = Callable[[Any], None]  # runs on the engine thread with the engine as argument
T = TypeVar("T")


class EngineThread:
    def __init__(
        self,
        engine: Any,
        loop: asyncio.AbstractEventLoop,
        *,
        on_outputs: Callable[[list[Any]], None],
        on_error: Callable[[str, BaseException], None],
        on_kv_events: Callable[[list[Any]], None] | None = None,
        idle_wait_s: float = 0.05,
    ) -> None:
        self._engine = engine
        self._loop = loop
        self._on_outputs = on_outputs
        self._on_error = on_error
        self._on_kv_events = on_kv_events
        self._idle_wait_s = idle_wait_s
        self._commands: queue.SimpleQueue[Command | None] = queue.SimpleQueue()
        self._live: set[str] = set()  # engine-thread only: requests the engine is running
        self._stats = engine.stats()  # replaced whole by the thread; readers see a snapshot
        # Held by the thread except in forward passes and idle waits (see `read`).
        self._book_lock = threading.Lock()
        engine.forward_gate = _Released(self._book_lock)
        self._thread = threading.Thread(target=self._run, name="kvfleet-engine", daemon=True)
        self._is_stopping = False

    @property
    def stats(self) -> Any:
        return self._stats

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self._commands.put(None)
        self._thread.join(timeout_s)

    # --- called from the event loop (thread-safe) ---

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: Any, **kw: Any
    ) -> asyncio.Future[Any]:
        """Queue engine.add_request; the future gets what it returned (None when it raised:
        the error then reaches the request's stream). Awaiting it is optional."""
        future: asyncio.Future[Any] = self._loop.create_future()

        def command(engine: Any) -> None:
            result = None
            try:
                result = engine.add_request(request_id, prompt_token_ids, params, **kw)
                self._live.add(request_id)
            finally:
                self._loop.call_soon_threadsafe(_settle, future, result, None)

        self._commands.put(_guarded(command, request_id, self._report_error))
        return future

    def abort(self, request_id: str) -> None:
        def command(engine: Any) -> None:
            self._live.discard(request_id)
            engine.abort_request(request_id)

        self._commands.put(_guarded(command, request_id, None))

    def call(self, fn: Callable[[Any], Any]) -> asyncio.Future[Any]:
        """Run fn(engine) on the engine thread; await the returned future for its result."""
        future: asyncio.Future[Any] = self._loop.create_future()

        def command(engine: Any) -> None:
            try:
                result = fn(engine)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting handler
                self._loop.call_soon_threadsafe(_settle, future, None, exc)
            else:
                self._loop.call_soon_threadsafe(_settle, future, result, None)

        self._commands.put(command)
        return future

    async def read(self, fn: Callable[[Any], T]) -> T:
        """fn(engine) on a worker thread, under the bookkeeping lock: while a step computes or
        the engine idles, not after the step. fn must only read (no block may change)."""
        return await asyncio.to_thread(self._read_locked, fn)

    def _read_locked(self, fn: Callable[[Any], T]) -> T:
        with self._book_lock:
            return fn(self._engine)

    # --- the thread ---

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def _run(self) -> None:
        with self._book_lock:
            self._run_locked()

    def _run_locked(self) -> None:
        try:
            while not self._is_stopping:
                # Wait for a command (bounded by idle_wait_s) when there is nothing to step, or
                # when live requests cannot run yet (held KV fills the cache): never spin.
                self._run_commands(block=not self._live or self._engine.is_last_step_idle)
                if self._is_stopping:
                    break
                if self._live:
                    self._step()
                self._stats = self._engine.stats()
                events = self._engine.drain_kv_events()
                if events and self._on_kv_events is not None:
                    self._loop.call_soon_threadsafe(self._on_kv_events, events)
        except Exception as exc:  # noqa: BLE001 - a broken engine: fail requests, show unhealthy
            log.exception("engine thread crashed")
            for request_id in list(self._live):
                self._report_error(request_id, exc)
            self._live.clear()
            return  # the thread ends: is_alive turns False and the server's watchdog stops
        for request_id in list(self._live):  # shutting down: free what is left
            self._engine.abort_request(request_id)
        self._live.clear()

    def _run_commands(self, *, block: bool) -> None:
        try:
            if block:
                with _Released(self._book_lock):
                    command = self._commands.get(timeout=self._idle_wait_s)
            else:
                command = self._commands.get_nowait()
        except queue.Empty:
            return
        while True:
            if command is None:
                self._is_stopping = True
                return
            command(self._engine)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return

    def _step(self) -> None:
        try:
            outputs = self._engine.step()
        except Exception as exc:  # noqa: BLE001 - fail the batch, keep serving
            log.exception("engine step failed; failing %d live requests", len(self._live))
            for request_id in list(self._live):
                self._live.discard(request_id)
                try:
                    self._engine.abort_request(request_id)
                except Exception:  # noqa: BLE001
                    log.exception("abort after failed step")
                self._report_error(request_id, exc)
            return
        for output in outputs:
            if output.is_finished:
                self._live.discard(output.request_id)
        if outputs:
            self._loop.call_soon_threadsafe(self._on_outputs, outputs)

    def _report_error(self, request_id: str, exc: BaseException) -> None:
        self._loop.call_soon_threadsafe(self._on_error, request_id, exc)


def _guarded(
    command: Command, request_id: str, on_error: Callable[[str, BaseException], None] | None
) -> Command:
    """A command whose failure is reported for its own request instead of killing the thread."""

    def run(engine: Any) -> None:
        try:
            command(engine)
        except Exception as exc:  # noqa: BLE001
            if on_error is None:
                log.exception("engine command for %s failed", request_id)
            else:
                on_error(request_id, exc)

    return run


class _Released:
    """The held `lock`, let go for the length of a with-block."""

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock

    def __enter__(self) -> None:
        self._lock.release()

    def __exit__(self, *exc: object) -> None:
        self._lock.acquire()


def _settle(future: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if future.done():
        return  # the awaiting handler was cancelled (client gone)
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)
