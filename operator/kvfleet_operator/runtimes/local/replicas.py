"""The local runtime: the router and every engine replica as child processes on loopback.

`LocalRuntime` is the control loop's `ReplicaRuntime` port for processes. A replica counts
as ready only after its `/health` answers 200. A replica that exits on its own is restarted
on the same port after an exponential backoff (so the router's endpoint address stays valid
and the router can readmit it); the crash is counted and shown in status. A deleted replica
gets SIGTERM (the engine drains), and SIGKILL if it outlives its grace period. Everything the
runtime starts is stopped by `shutdown()`.

A SIGKILLed `kvfleet up` takes nothing with it: the children outlive it and keep serving
(procs.py), and the next `up` on the same state dir `adopt`s them from the records the
runtime writes to children.json on every change, a spawn first of all (pid and start time,
port, state, restarts, drain deadline), so it never starts a duplicate nor leaves one
behind. A recorded replica that died meanwhile is restarted on its port if it was serving,
and forgotten if it was leaving (draining or stopping). One whose command line is not what
the pool asks for now (the pool was edited meanwhile) is adopted draining, so the loop
replaces it without losing a request; a router in that case is restarted on its port.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.decide.engine_args import engine_args, engine_command, engine_env
from kvfleet_operator.decide.reconcile import RolePlan
from kvfleet_operator.loop import events as ev
from kvfleet_operator.loop.ports import EventSink
from kvfleet_operator.runtimes.local import procs
from kvfleet_operator.runtimes.local.backoff import Backoff
from kvfleet_operator.runtimes.local.state_dir import StateDir

HOST = "127.0.0.1"
ROUTER_NAME = "router"

# Replica lifecycle. Only `ready` and `draining` replicas are in the router's config.
STARTING, READY, CRASHED = "starting", "ready", "failed"  # reconcile's phase names
DRAINING, STOPPING = "draining", "stopping"


def kvfleet_argv(*args: str) -> list[str]:
    """`kvfleet <args>` with this interpreter, so no console script on PATH is needed."""
    return [sys.executable, "-m", "kvfleet_operator.cli.main", *args]


def leftover_records(
    state: dict[str, Any] | None, pool_name: str, children: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """The child records an earlier `up` of this pool left without stopping them (it was
    killed): `children` (the runtime's own file, `StateDir.read_children`) or else
    state.json's `replicas`; what `LocalRuntime.adopt` takes back. [] after a clean stop."""
    if state is not None and (state.get("pool") != pool_name or state.get("is_stopped")):
        return []
    records = children if children is not None else (state or {}).get("replicas")
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


def running_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Those records whose very process still runs."""
    return [r for r in records if procs.adopt(r.get("pid"), r.get("start_ticks")) is not None]


@dataclass(slots=True)
class Child:
    """One supervised process: a router or an engine replica."""

    name: str
    role: str
    port: int
    argv_for: Callable[[int], list[str]]  # the full command line for a given port
    env: dict[str, str] | None = None  # extra environment on top of ours
    is_port_fixed: bool = False  # the router keeps the endpoint it printed, come what may
    proc: procs.Proc | None = None
    state: str = STARTING
    num_restarts: int = 0
    num_recent_crashes: int = 0
    started_at: float = 0.0
    restart_at: float | None = None
    kill_at: float | None = None  # a stopping child still alive then gets SIGKILL
    last_exit_code: int | None = None
    last_error: str = ""  # why it last failed: its own last log line, or the start-up timeout
    kill_reason: str = ""  # set when we kill it ourselves, for this run only
    revision: str = ""  # the engine template it runs (the router's is "")

    @property
    def address(self) -> str:
        return f"http://{HOST}:{self.port}"

    start_ticks: int | None = None  # when its process started (procs.start_ticks)

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def to_status(self, now: float) -> dict[str, Any]:
        return {
            "name": self.name,
            "role": self.role,
            "revision": self.revision,
            "address": self.address,
            "port": self.port,
            "pid": self.pid,
            "start_ticks": self.start_ticks,
            "started_at": self.started_at,  # the runtime's clock: monotonic, machine-wide
            "kill_at": self.kill_at,
            "state": self.state,
            "num_restarts": self.num_restarts,
            "last_exit_code": self.last_exit_code,
            "last_error": self.last_error,
            "uptime_s": round(now - self.started_at, 1) if self.state == READY else 0.0,
            "restart_in_s": (
                round(max(0.0, self.restart_at - now), 1) if self.restart_at is not None else None
            ),
        }


class _NoEvents:
    def emit(self, event: ev.Event) -> None:
        pass


class LocalRuntime:
    def __init__(
        self,
        state_dir: StateDir,
        *,
        backoff: Backoff | None = None,
        startup_timeout_s: float = 600.0,  # loading a real model on CPU can take minutes
        events: EventSink | None = None,
        clock: Callable[[], float] = time.monotonic,
        engine_env: dict[str, str] | None = None,
    ) -> None:
        self.state_dir = state_dir
        self.backoff = backoff or Backoff()
        self.startup_timeout_s = startup_timeout_s
        self.events: EventSink = events or _NoEvents()
        self.clock = clock
        self._engine_env = dict(engine_env or {})  # may hold secrets: never shown
        self.children: dict[str, Child] = {}
        self._next_index: dict[str, int] = {}
        self._http: aiohttp.ClientSession | None = None
        self._persisted: list[dict[str, Any]] | None = None

    async def __aenter__(self) -> LocalRuntime:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0))
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    # --- starting -------------------------------------------------------------------------

    def _spawn(self, child: Child) -> None:
        env = {**os.environ, **child.env} if child.env else None
        log = self.state_dir.log_file(child.name)
        child.proc = procs.spawn(child.argv_for(child.port), log, env, outlive_parent=True)
        child.start_ticks = procs.start_ticks(child.proc.pid)
        self._persist()
        child.state = STARTING
        child.started_at = self.clock()
        child.restart_at = None
        child.kill_reason = ""

    def start_router(
        self, argv_for: Callable[[int], list[str]], port: int | None = None,
        env: dict[str, str] | None = None,
    ) -> Child:
        child = Child(ROUTER_NAME, ROUTER_NAME, port or procs.free_port(), argv_for, env,
                      is_port_fixed=True)
        self.children[child.name] = child
        self._spawn(child)
        return child

    def add_replica(
        self, role: str, argv_for: Callable[[int], list[str]], env: dict[str, str] | None = None
    ) -> Child:
        index = self._next_index.get(role, 0)
        self._next_index[role] = index + 1
        child = Child(f"{role}-{index}", role, procs.free_port(), argv_for, env)
        self.children[child.name] = child
        self._spawn(child)
        self._say(ev.EventReason.REPLICA_STARTED, f"start {child.name} on {child.address}")
        return child

    async def create(self, spec: PoolSpec, plan: RolePlan) -> None:
        """One more replica of `plan.role`: the plan's command and env, with the role's args
        rendered for the loopback port this replica gets."""
        role = plan.role

        def argv_for(port: int) -> list[str]:
            return plan.command + engine_args(spec, role, host=HOST, port=port)

        child = self.add_replica(role, argv_for, {**plan.env, **self._engine_env})
        child.revision = plan.revision

    def adopt(
        self, records: Any, spec: PoolSpec, router_argv_for: Callable[[int], list[str]],
        router_env: dict[str, str] | None = None,
    ) -> Child | None:  # fmt: skip
        """Take back the children an earlier `up` on this state dir left running (its
        state.json `replicas`); returns the router if it was adopted. Engines get their
        command from `spec` (as `create` does), should one need a restart later."""
        now = self.clock()
        for record in records if isinstance(records, list) else []:
            child = self._adopted_child(record, spec, router_argv_for, router_env, now)
            if child is None:
                continue
            self.children[child.name] = child
            if child.name != ROUTER_NAME:
                index = child.name.rsplit("-", 1)[-1]
                if index.isdigit():
                    self._next_index[child.role] = max(self._next_index.get(child.role, 0),
                                                       int(index) + 1)  # fmt: skip
        self._persist()
        return self.children.get(ROUTER_NAME)

    def _adopted_child(
        self, record: Any, spec: PoolSpec, router_argv_for: Callable[[int], list[str]],
        router_env: dict[str, str] | None, now: float,
    ) -> Child | None:  # fmt: skip
        try:
            name, role, port = str(record["name"]), str(record["role"]), int(record["port"])
            state = str(record["state"])
        except (KeyError, TypeError, ValueError):
            return None  # a record from before adoption existed, or junk: nothing to adopt
        if name in self.children or not 0 < port < 65536:
            return None
        if name == ROUTER_NAME:
            argv_for, env, fixed = router_argv_for, router_env, True
        elif role in spec.topology.roles():
            def argv_for(p: int, role: str = role) -> list[str]:
                return engine_command(spec) + engine_args(spec, role, host=HOST, port=p)

            env, fixed = {**engine_env(spec, role), **self._engine_env}, False
        else:
            return None  # a role the pool no longer has: not ours to run
        proc = procs.adopt(record.get("pid"), record.get("start_ticks"))
        restarts = record.get("num_restarts")
        revision = record.get("revision")
        child = Child(name, role, port, argv_for, env, is_port_fixed=fixed, proc=proc,
                      num_restarts=restarts if isinstance(restarts, int) else 0,
                      start_ticks=proc.ticks if proc is not None else None,
                      revision=revision if isinstance(revision, str) else "")  # fmt: skip
        if proc is None:
            if state in (DRAINING, STOPPING):
                self._say(ev.EventReason.REPLICA_STOPPED, f"{name} exited while no loop ran")
                return None  # it was leaving anyway
            child.state, child.restart_at = CRASHED, now  # restart it on this tick
            child.last_error = "exited while no `kvfleet up` ran"
            self._say(ev.EventReason.REPLICA_CRASHED, f"{name} exited while no loop ran; "
                      "restarting it", is_warning=True)  # fmt: skip
            return child
        started = record.get("started_at")
        child.started_at = float(started) if isinstance(started, int | float) else now
        kill_at = record.get("kill_at")
        child.kill_at = float(kill_at) if isinstance(kill_at, int | float) else None
        child.state = state if state in (READY, DRAINING, STOPPING) else STARTING
        if child.state == STOPPING and child.kill_at is None:
            child.kill_at = now  # its grace period is unknown: it has had it
        is_current = procs.cmdline(proc.pid) == argv_for(port)
        if not is_current and name == ROUTER_NAME:
            # The pool's router settings changed meanwhile: a router cannot drain, so it
            # is stopped and started again on its port (its in-flight requests end).
            procs.stop([proc], grace_s=10.0)
            child.proc, child.state, child.restart_at = None, CRASHED, now
            child.last_error = "its command line differs from the pool's now"
            self._say(ev.EventReason.REPLICA_RESTARTED, "router: settings changed while no "
                      "loop ran; restarting it on its port", is_warning=True)  # fmt: skip
            return child
        if not is_current and not child.revision and child.state in (READY, STARTING):
            # No revision recorded (an `up` from before revisions): replace it. One with a
            # revision is the rollout's to keep or replace.
            child.state = DRAINING  # the loop drains it (the router is told) and replaces it
        where = "" if name == ROUTER_NAME else f" on {child.address}"
        stale = "" if is_current else "; its command differs from the pool's now, so it drains"
        self._say(ev.EventReason.REPLICA_ADOPTED,
                  f"adopt {name}{where} (pid {proc.pid}, {child.state}{stale})")  # fmt: skip
        return child

    def _persist(self) -> None:
        """Record what runs now (`StateDir.write_children`, when it changed), for a
        successor to adopt."""
        volatile = ("uptime_s", "restart_in_s")
        records = [{k: v for k, v in r.items() if k not in volatile} for r in self.status()]
        if records == self._persisted:
            return
        try:
            self.state_dir.write_children(records)
        except OSError:
            return  # the state dir is gone: the loop's own save reports it
        self._persisted = records

    def _say(self, reason: str, message: str, is_warning: bool = False) -> None:
        self.events.emit(ev.warning(reason, message) if is_warning else ev.normal(reason, message))

    @property
    def router(self) -> Child:
        return self.children[ROUTER_NAME]

    def replicas(self, role: str | None = None) -> list[Child]:
        return [
            c
            for c in self.children.values()
            if c.name != ROUTER_NAME and (role is None or c.role == role)
        ]

    async def wait_ready(
        self, name: str, timeout_s: float, stop: asyncio.Event | None = None
    ) -> bool:
        deadline = self.clock() + timeout_s
        while self.clock() < deadline and not (stop is not None and stop.is_set()):
            await self.supervise()
            child = self.children.get(name)
            if child is None:
                return False
            if child.state == READY:
                return True
            await asyncio.sleep(0.2)
        return False

    # --- supervision ----------------------------------------------------------------------

    async def _is_healthy(self, child: Child) -> bool:
        assert self._http is not None, "use LocalRuntime as an async context manager"
        try:
            async with self._http.get(f"{child.address}/health") as resp:
                return resp.status == 200
        except (TimeoutError, aiohttp.ClientError, OSError):
            return False

    def _on_exit(self, child: Child, now: float) -> None:
        assert child.proc is not None
        child.last_exit_code = child.proc.returncode
        # An adopted process is init's child: its exit status never reaches us.
        code = ("?" if isinstance(child.proc, procs.Adopted)
                else str(child.last_exit_code))  # fmt: skip
        if child.state in (STOPPING, DRAINING):
            # Leaving anyway: a drained replica that dies is simply gone, never restarted.
            del self.children[child.name]
            self._say(ev.EventReason.REPLICA_STOPPED,
                      f"stopped {child.name} (exit {code})")  # fmt: skip
            return
        uptime = now - child.started_at
        child.num_recent_crashes = self.backoff.recent_crashes(child.num_recent_crashes, uptime)
        delay = self.backoff.delay(child.num_recent_crashes)
        is_starting = child.state == STARTING
        line = procs.last_line(self.state_dir.log_file(child.name))
        child.last_error = child.kill_reason or (
            f"exited with {code}" + (f": {line}" if line else ""))
        child.state = CRASHED
        child.restart_at = now + delay
        during = " during start-up" if is_starting else ""
        self._say(
            ev.EventReason.REPLICA_CRASHED,
            f"{child.name} exited with {code}{during}; restart in {delay:.1f}s "
            f"(see {self.state_dir.log_file(child.name)})"
            + (f": {child.last_error}" if is_starting else ""),
            is_warning=True,
        )

    async def supervise(self) -> None:
        """One pass: reap exits, restart due crashes, promote healthy starters to ready."""
        now = self.clock()
        starting: list[Child] = []
        for child in list(self.children.values()):
            if child.proc is not None and child.state != CRASHED and child.proc.poll() is not None:
                self._on_exit(child, now)
                continue
            if child.state == CRASHED and child.restart_at is not None and now >= child.restart_at:
                child.num_restarts += 1
                if not child.is_port_fixed and not procs.can_bind(child.port):
                    child.port = procs.free_port()
                self._spawn(child)
                self._say(ev.EventReason.REPLICA_RESTARTED,
                          f"restart {child.name} (restart #{child.num_restarts})")  # fmt: skip
            elif child.state == STOPPING and child.kill_at is not None and now >= child.kill_at:
                assert child.proc is not None
                self._say(ev.EventReason.REPLICA_STOPPING,
                          f"{child.name} outlived its grace period; killing it", is_warning=True)
                procs.signal_group(child.proc, signal.SIGKILL)
                child.kill_at = None
            elif child.state == STARTING:
                starting.append(child)
        healthy = await asyncio.gather(*(self._is_healthy(c) for c in starting))
        for child, is_healthy in zip(starting, healthy, strict=True):
            if child.state != STARTING:
                continue
            if is_healthy:
                child.state = READY
                child.last_error = ""
                # The router's address is the pool's endpoint: `kvfleet up` announces it
                # once, when the pool serves, so this line does not show it.
                where = "" if child.name == ROUTER_NAME else f" on {child.address}"
                self._say(ev.EventReason.REPLICA_READY, f"{child.name} ready{where}")
            elif self.clock() - child.started_at > self.startup_timeout_s:
                limit = self.startup_timeout_s
                child.kill_reason = f"not healthy after {limit:g}s of start-up"
                self._say(ev.EventReason.REPLICA_START_TIMEOUT,
                          f"{child.name} not healthy after {limit:g}s; killing it",
                          is_warning=True)  # fmt: skip
                if child.proc is not None:
                    procs.signal_group(child.proc, signal.SIGKILL)
        self._persist()

    # --- stopping -------------------------------------------------------------------------

    async def mark_draining(self, name: str) -> None:
        self.children[name].state = DRAINING
        self._persist()

    async def mark_ready(self, name: str) -> None:
        """A draining replica goes back to work (its cache is warm)."""
        self.children[name].state = READY
        self._persist()

    async def delete(self, name: str, grace_s: float) -> None:
        """SIGTERM: the engine drains what it still holds and exits; supervise() reaps it,
        or SIGKILLs it after `grace_s`."""
        child = self.children[name]
        if child.proc is None or child.proc.poll() is not None or child.state == CRASHED:
            del self.children[name]
            self._persist()
            self._say(ev.EventReason.REPLICA_STOPPED, f"removed {name}")
            return
        child.state = STOPPING
        child.kill_at = self.clock() + grace_s
        self._persist()
        procs.signal_group(child.proc, signal.SIGTERM)

    async def shutdown(self, grace_s: float = 10.0) -> None:
        running = [c.proc for c in self.children.values() if c.proc is not None]
        if running:
            # Blocking wait off the loop so signal handlers and prints keep working.
            await asyncio.get_running_loop().run_in_executor(None, procs.stop, running, grace_s)
        self.children.clear()
        self._persist()  # nothing left to adopt
        if self._http is not None:
            await self._http.close()
            self._http = None

    def status(self) -> list[dict[str, Any]]:
        now = self.clock()
        return [c.to_status(now) for c in self.children.values()]

