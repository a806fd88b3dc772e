"""`kvfleet up pool.yaml [--state-dir DIR] [--port N]`: run a whole InferencePool locally.

The router and every engine replica run as child processes on 127.0.0.1; the control loop
scales them. It prints the OpenAI endpoint, then live progress (replicas per role, signals,
scale events). Ctrl-C or SIGTERM stops every child. A SIGKILLed `up` leaves them serving; the
next `up` on the same state dir adopts them (no duplicates, drain deadlines and the router
config version carried on). `kvfleet status` shows the same from another terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

import aiohttp
from kvfleet_engine.contract import ENGINE_TOKEN_ENV
from kvfleet_router.exchange_seed import SEED_ENV, hash_seed_for

from kvfleet_operator.api.advice import odd_settings
from kvfleet_operator.api.errors import SpecError
from kvfleet_operator.api.pool import InferencePool, load_pool
from kvfleet_operator.api.status import FALSE, ConditionType, Reason
from kvfleet_operator.api.vllm_compat import check_vllm_engine
from kvfleet_operator.decide.engine_args import VLLM_PYTHON_ENV, engine_command
from kvfleet_operator.loop import events as ev
from kvfleet_operator.loop.control_loop import ControlLoop, LoopTiming
from kvfleet_operator.loop.events import Fanout
from kvfleet_operator.loop.metrics import LoopMetrics
from kvfleet_operator.runtimes import metrics_server
from kvfleet_operator.runtimes.local import fleet_registry, procs
from kvfleet_operator.runtimes.local.backoff import Backoff
from kvfleet_operator.runtimes.local.progress import summary_line
from kvfleet_operator.runtimes.local.replicas import (
    HOST,
    ROUTER_NAME,
    LocalRuntime,
    kvfleet_argv,
    leftover_records,
    running_records,
)
from kvfleet_operator.runtimes.local.spec_support import unhonoured_fields
from kvfleet_operator.runtimes.local.state_dir import StateDir, default_state_dir, running_pid
from kvfleet_operator.runtimes.local.store import StateFileStore
from kvfleet_operator.runtimes.metrics_sources import ScrapeMetrics
from kvfleet_operator.runtimes.router_control import HttpRouterControl

ROUTER_START_TIMEOUT_S = 60.0
NUM_EVENTS_KEPT = 50
MAX_RESTART_BACKOFF_S = 300.0
SUMMARY_EVERY_S = 5.0  # signals move every tick; repeat the summary line at most this often


class UpError(Exception):
    """A one-line reason why the fleet cannot start."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UpError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvfleet up", description=__doc__.splitlines()[0])
    p.add_argument("pool", type=Path, help="an InferencePool YAML file")
    p.add_argument("--state-dir", type=Path, help="default: ./.kvfleet/<pool name>/")
    p.add_argument("--port", type=int, default=0, help="router port (default: a free one)")
    p.add_argument("--restart-backoff", type=float, default=0.5, metavar="SECONDS",
                   help="first delay before restarting a crashed process; doubles per crash")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="port of the control plane's /metrics on 127.0.0.1 (default: a free one)")
    p.add_argument("--quiet", action="store_true", help="print only the endpoint and errors")
    p.add_argument("--api-keys-file", type=Path, metavar="FILE",
                   help="YAML mapping of client API key to tenant, for the router (what "
                   "routing.flowControl.apiKeysSecretRef mounts on Kubernetes; required when "
                   "the pool sets it): clients must then send Authorization: Bearer KEY")
    return p


class Progress:
    """Prints events as they happen and the fleet summary when it changes."""

    def __init__(self, out: TextIO, is_quiet: bool = False) -> None:
        self.out = out
        self.is_quiet = is_quiet
        self.events: list[dict[str, str]] = []
        self._last_summary = ""
        self._last_counts = ""
        self._last_print = 0.0

    def say(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {message}", file=self.out, flush=True)

    def emit(self, event: ev.Event) -> None:
        """The loop's and the runtime's events: printed, and the last ones kept for status."""
        self.events.append({"time": time.strftime("%H:%M:%S"), "type": event.type,
                            "reason": event.reason, "message": event.message})
        del self.events[:-NUM_EVENTS_KEPT]
        if not self.is_quiet:
            self.say(event.message if event.type == ev.NORMAL else f"warning: {event.message}")

    def summary(self, state: dict[str, Any]) -> None:
        line = summary_line(state)
        counts = line.split("[")[0] if "[" in line else line
        now = time.monotonic()
        is_due = line != self._last_summary and now - self._last_print >= SUMMARY_EVERY_S
        if not self.is_quiet and (counts != self._last_counts or is_due):
            self.say(line)
            self._last_print = now
            self._last_summary = line
        self._last_counts = counts


def local_device() -> str:
    """What a local vLLM replica runs on: a GPU when this machine has NVIDIA's driver."""
    return "cuda" if Path("/dev/nvidiactl").exists() else "cpu"


def _can_import(python: str, module: str) -> bool:
    """Whether `python` can import `module` (without importing it: vLLM takes seconds)."""
    check = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-c", check], capture_output=True,
                              timeout=30).returncode == 0  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return False


def _prepare(args: argparse.Namespace) -> tuple[InferencePool, StateDir]:
    try:
        pool = load_pool(args.pool)
    except SpecError as exc:
        text = str(exc)
        raise UpError(text if str(args.pool) in text else f"{args.pool}: {text}") from None
    try:  # a local vLLM runs on this machine's device: its limits are known here
        check_vllm_engine(pool.spec.engine, device=local_device())
    except SpecError as exc:
        raise UpError(f"{args.pool}: spec.{exc}") from None
    command = engine_command(pool.spec)
    if shutil.which(command[0]) is None:
        raise UpError(f"engine.kind {pool.spec.engine.kind} needs `{command[0]}` on PATH "
                      "(local fleets without it use engine.kind: builtin)")
    if command[1:2] == ["-m"] and not _can_import(command[0], command[2].split(".")[0]):
        raise UpError(f"engine.kind {pool.spec.engine.kind} needs a Python with "
                      f"`{command[2].split('.')[0]}` installed; {command[0]} has none (set "
                      f"{VLLM_PYTHON_ENV} to one, or use engine.kind: builtin)")
    if not 0 < args.restart_backoff <= MAX_RESTART_BACKOFF_S:
        raise UpError(f"--restart-backoff must be in (0, {MAX_RESTART_BACKOFF_S:g}] seconds")
    if not 0 <= args.port < 65536:
        raise UpError(f"--port {args.port} is out of range")
    state_dir = StateDir(args.state_dir or default_state_dir(pool.name))
    running = running_records(leftover_records(state_dir.read_state(), pool.name,
                                               state_dir.read_children()))  # fmt: skip
    is_ours = any(r.get("name") == ROUTER_NAME and r.get("port") == args.port for r in running)
    if args.port and not is_ours and not procs.can_bind(args.port, HOST):
        raise UpError(f"port {args.port} on {HOST} is in use")
    if not 0 <= args.metrics_port < 65536:
        raise UpError(f"--metrics-port {args.metrics_port} is out of range")
    if args.metrics_port and not procs.can_bind(args.metrics_port, HOST):
        raise UpError(f"port {args.metrics_port} on {HOST} is in use")
    _check_api_keys(pool, args.api_keys_file)
    pid = running_pid(state_dir.read_state())
    if pid is not None and pid != os.getpid():
        raise UpError(f"a fleet is already running from {state_dir.path} (pid {pid})")
    try:
        state_dir.create()
    except OSError as exc:
        raise UpError(f"cannot create state dir {state_dir.path}: {exc.strerror}") from None
    fleet_registry.register(pool.name, state_dir.path)  # so `kvfleet status` finds it from anywhere
    return pool, state_dir


def _check_api_keys(pool: InferencePool, path: Path | None) -> None:
    """A pool that names an API-keys Secret never runs open: locally the keys come from
    --api-keys-file (the same YAML the Secret holds)."""
    fc = pool.spec.routing.flow_control
    ref = fc.api_keys_secret_ref if fc is not None else None
    if ref is not None and path is None:
        raise UpError(f"spec.routing.flowControl.apiKeysSecretRef names Secret {ref.name} "
                      "(Kubernetes); locally pass its keys file with --api-keys-file FILE")
    if path is not None and not os.access(path, os.R_OK):
        raise UpError(f"--api-keys-file {path}: not a readable file")


class SpecWatcher:
    """The pool file, watched: an edit the fleet can take becomes the loop's new spec (a new
    engine template rolls out by `spec.rollout`); one it cannot take is reported once, and
    the fleet keeps the spec it runs."""

    def __init__(self, path: Path, pool: InferencePool) -> None:
        self.path, self.pool = path, pool
        self._seen = self._stamp()

    def _stamp(self) -> tuple[float, int] | None:
        try:
            info = self.path.stat()
        except OSError:
            return None
        return info.st_mtime, info.st_size

    def poll(self) -> InferencePool | str | None:
        """A new pool, a one-line reason the edit was refused, or None (no edit)."""
        stamp = self._stamp()
        if stamp is None or stamp == self._seen:
            return None
        self._seen = stamp
        try:
            new = load_pool(self.path)
            check_vllm_engine(new.spec.engine, device=local_device())
        except SpecError as exc:
            return f"spec change ignored: {exc}"
        if new.name != self.pool.name:
            return (f"spec change ignored: metadata.name changed ({self.pool.name} -> "
                    f"{new.name}); a local fleet keeps its name")
        if new.spec == self.pool.spec and new.annotations == self.pool.annotations:
            return None
        return new


def is_serving(desired: dict[str, int], pushed: dict[str, Any] | None) -> bool:
    """The router can answer a request now: every role that should run has an active
    endpoint in the config the router accepted (a role at zero has the router hold its
    requests while a replica starts)."""
    if pushed is None:
        return False
    active = {e["role"] for e in pushed.get("endpoints", []) if e.get("state") == "active"}
    return all(role in active for role, num in desired.items() if num > 0)


async def run_fleet(
    pool: InferencePool,
    state_dir: StateDir,
    port: int,
    progress: Progress,
    stop: asyncio.Event,
    backoff: Backoff | None = None,
    metrics_port: int = 0,
    api_keys_file: Path | None = None,
    pool_file: Path | None = None,
) -> int:
    # Details (tracebacks of a failed control-loop tick) go to a file, not the terminal.
    logging.basicConfig(filename=state_dir.log_file("up"), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # A killed `up` left children serving: adopt them, with the tokens they hold.
    leftovers = leftover_records(state_dir.read_state(), pool.name, state_dir.read_children())
    is_kept = bool(running_records(leftovers))
    token = state_dir.admin_token(is_kept)  # the router reads it from the file; never printed
    base: dict[str, Any] = {"pool": pool.name, "pid": os.getpid(), "state_dir": str(state_dir.path),
                            "model": pool.spec.model.api_name, "is_stopped": False,
                            "is_serving": False}
    grace_s = float(pool.spec.autoscaling.drain_timeout_seconds) + 5.0
    # Engines share a per-fleet token for their KV-transfer and KV-event endpoints, so nothing
    # else on the machine can read cached prompts off a replica; the router gets it too.
    engine_token = {ENGINE_TOKEN_ENV: state_dir.engine_token(is_kept)}
    timing = LoopTiming()
    loop_metrics = LoopMetrics(pool.name, pool.spec)
    events = Fanout(progress, loop_metrics)
    async with LocalRuntime(state_dir, backoff=backoff, events=events,
                            engine_env=engine_token) as runtime:  # fmt: skip
        keys = ["--api-keys-file", str(api_keys_file.resolve())] if api_keys_file else []
        # routing.workers as given (no CPU request to derive it from locally); the workers
        # share what they learn among themselves (exchange.py), whatever the config says
        if (workers := pool.spec.routing.workers or 1) > 1:
            keys += ["--workers", str(workers)]

        def router_argv(p: int) -> list[str]:
            return kvfleet_argv("router", "--host", HOST, "--port", str(p),
                                "--admin-token-file", str(state_dir.token_file), *keys)

        # the pool's hash seed in the router's environment: it runs as started, without the
        # re-exec that would set it, so a later `up` recognises its command line and adopts it
        router_env = {**engine_token, SEED_ENV: hash_seed_for(token)}
        adopted = runtime.adopt(leftovers, pool.spec, router_argv, router_env) if is_kept \
            else None  # fmt: skip
        router = adopted or runtime.start_router(router_argv, port=port or None, env=router_env)
        endpoint = f"{router.address}/v1"
        base["endpoint"] = endpoint
        if not await runtime.wait_ready(router.name, ROUTER_START_TIMEOUT_S, stop):
            await runtime.shutdown(grace_s=2.0)
            if stop.is_set():
                progress.say("stopped before the router was ready")
                return 0
            progress.say(f"router did not start; see {state_dir.log_file(router.name)}")
            return 1
        for line in unhonoured_fields(pool.spec):
            progress.emit(ev.warning(ev.EventReason.SPEC_NOT_HONOURED, line))
        for line in odd_settings(pool.spec):
            progress.emit(ev.warning(ev.EventReason.ODD_SETTING, line))
        progress.say(f"pool {pool.name}: starting replicas; the endpoint is announced once "
                     "the router can serve")
        http_timeout = aiohttp.ClientTimeout(total=timing.scrape_timeout_s)
        metrics_runner, bound = await metrics_server.start(loop_metrics, HOST, metrics_port)
        base["metrics_endpoint"] = f"http://{HOST}:{bound}/metrics"
        async with aiohttp.ClientSession(timeout=http_timeout) as http:
            store = StateFileStore(state_dir, pool.name, base, runtime.status,
                                   lambda: progress.events, events)  # fmt: skip
            loop = ControlLoop(
                pool,
                runtime=runtime,
                router=HttpRouterControl(http, [router.address], token),
                metrics=ScrapeMetrics(http, timing.scrape_timeout_s),
                store=store,
                events=events,
                timing=timing,
            )

            watcher = SpecWatcher(pool_file, pool) if pool_file is not None else None

            def after_tick() -> None:
                if watcher is not None and (change := watcher.poll()) is not None:
                    if isinstance(change, str):
                        progress.emit(ev.warning(ev.EventReason.SPEC_NOT_HONOURED, change))
                    else:
                        pool.annotations = change.annotations  # the promote annotation
                        if change.spec != pool.spec:
                            loop.replace_spec(change.spec)
                            progress.say(f"pool {pool.name}: spec changed; generation "
                                         f"{pool.generation} ({change.spec.rollout.strategy})")
                loop_metrics.observe_status(pool.status, loop.num_held)
                desired = {r: rs.desired_replicas for r, rs in pool.status.roles.items()}
                if not base["is_serving"] and is_serving(desired, loop.state.router_config):
                    base["is_serving"] = True
                    progress.say(f"pool {pool.name}: OpenAI endpoint {endpoint} "
                                 f"(model {pool.spec.model.api_name})")
                    progress.say(f"state in {state_dir.path}; `kvfleet status` shows it; "
                                 "Ctrl-C stops")
                progress.summary(store.last)

            await loop.run(stop, after_tick=after_tick)
            progress.say(f"stopping {len(runtime.children)} processes")
            await runtime.shutdown(grace_s=grace_s)
            base.update(is_stopped=True, is_serving=False)
            pool.status.set_condition(ConditionType.READY, FALSE, Reason.STOPPED,
                                      "`kvfleet up` stopped; nothing serves",
                                      datetime.now(UTC))  # fmt: skip
            await store.save(pool.status, loop.state, loop.snapshot())
        await metrics_runner.cleanup()
    progress.say("stopped; no process left")
    return 0


def main(argv: list[str], out: TextIO = sys.stdout) -> int:
    try:
        args = _parser().parse_args(argv)
        pool, state_dir = _prepare(args)
    except UpError as exc:
        print(f"kvfleet up: {exc}", file=sys.stderr)
        return 2
    progress = Progress(out, args.quiet)

    async def _main() -> int:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            loop.add_signal_handler(sig, stop.set)
        backoff = Backoff(base_s=args.restart_backoff, max_s=max(30.0, args.restart_backoff))
        return await run_fleet(pool, state_dir, args.port, progress, stop, backoff,
                               args.metrics_port, args.api_keys_file, Path(args.pool))

    return asyncio.run(_main())
