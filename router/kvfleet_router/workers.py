"""`kvfleet router --workers N`: one router pod on N cores.

One Python process routes on one core (the GIL), so a pod given N cores runs N router
processes on its one public port. The parent (`supervise`) is a supervisor only: it serves
nothing and imports no aiohttp. It

- picks N free private ports on 127.0.0.1 and starts N children, each `kvfleet router`
  with the same arguments plus `--workers 1 --worker-index i --exchange-listen 127.0.0.1:P_i
  --exchange-siblings <the other workers' URLs>` (argparse keeps the last `--workers`,
  so the parent's stays on the line unedited; the children inherit PYTHONHASHSEED, which
  `exchange_seed.ensure_hash_seed` set before they were started, and share one
  KVFLEET_ROUTER_GROUP, the pod's exchange group);
- prints one listening line once every child answers /health on its private port;
- forwards SIGTERM/SIGINT to the children and waits for their drain (30 s each, theirs;
  `STOP_GRACE_S` here before SIGKILL), then exits 0 when they all exited 0;
- restarts a child that dies on its own, after a backoff that doubles per quick death
  (`RESTART_BACKOFF_S` .. `RESTART_BACKOFF_MAX_S`, reset once a child lived
  `RESTART_RESET_AFTER_S`), logged at WARNING;
- exits 1 when a child cannot start (its own one-line error says why, e.g. the port).

Every child binds the public host:port with SO_REUSEPORT, so the kernel spreads new
connections over them (Linux hashes each connection to one listener; a connection stays
on its worker). Each child also serves the same app on its private loopback port: its
siblings' state exchange (exchange.py) and config relay reach it there, and there it
answers /metrics and GET /admin/config for itself alone (the public port answers for the
pod: worker_views.py).

A worker's share of the pod (`worker_app`):
- a config the operator pushes (PUT/POST /admin/config, on the public port) lands on one
  worker; that worker relays it to its siblings before answering, so the pod answers 200
  when every worker has it (a sibling that cannot be reached is logged: it gets the
  operator's next push, or catches up when it restarts);
- a (re)started worker pulls the newest config its siblings hold before it counts as up
  (the --config file can be older than the operator's last push);
- GET /admin/config and /metrics on the public port merge every worker's own view
  (worker_views.py): the operator and Prometheus see one router;
- a worker whose parent is gone (SIGKILLed supervisor) drains and exits instead of
  serving on alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvfleet_router.exchange_seed import GROUP_ENV, RUN_ROUTER

if TYPE_CHECKING:  # the supervisor never imports aiohttp
    from aiohttp import web

    from kvfleet_router.app import RouterApp

log = logging.getLogger(__name__)

MAX_WORKERS = 64
PRIVATE_HOST = "127.0.0.1"
RELAY_HEADER = "X-Kvfleet-Relayed"  # a config push one worker passes to its siblings
START_TIMEOUT_S = 60.0  # every child up (answers /health) within this, else exit 1
STOP_GRACE_S = 40.0  # a child's drain is 30 s (http_protocol.serve); then SIGKILL
RESTART_BACKOFF_S = 0.5
RESTART_BACKOFF_MAX_S = 30.0
RESTART_RESET_AFTER_S = 30.0
POLL_S = 0.1
RELAY_TIMEOUT_S = 5.0
PARENT_CHECK_S = 1.0


def reuse_port_problem() -> str | None:
    """Why this platform cannot run workers, or None. Only Linux spreads connections over
    the sockets sharing a port; elsewhere SO_REUSEPORT is missing or gives one socket all."""
    if not hasattr(socket, "SO_REUSEPORT") or not sys.platform.startswith("linux"):
        return f"--workers needs SO_REUSEPORT load balancing (Linux); this is {sys.platform}"
    return None


def check_public_bind(host: str, port: int) -> None:
    """Raise OSError when host:port cannot be shared: another process holds it without
    SO_REUSEPORT. Checked once in the parent so a taken port is one line, not N."""
    for family, kind, proto, _, addr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind(addr)


def free_private_ports(n: int) -> list[int]:
    """N distinct free ports on the loopback (all held open until all are picked)."""
    socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(n)]
    try:
        for sock in socks:
            sock.bind((PRIVATE_HOST, 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def private_url(port: int) -> str:
    return f"http://{PRIVATE_HOST}:{port}"


def child_argv(base: list[str], index: int, ports: list[int]) -> list[str]:
    """The command line of worker `index`: the parent's own (argparse keeps the last
    value of a repeated flag, so `--workers 1` here overrides the parent's)."""
    siblings = ",".join(private_url(p) for i, p in enumerate(ports) if i != index)
    return [*base, "--workers", "1", "--worker-index", str(index),
            "--exchange-listen", f"{PRIVATE_HOST}:{ports[index]}",
            "--exchange-siblings", siblings]


def parse_listen(value: str) -> tuple[str, int]:
    """`--exchange-listen host:port` (a loopback address in practice)."""
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--exchange-listen {value!r}: expected host:port")
    return host.strip("[]"), int(port)


def parse_siblings(value: str) -> list[str]:
    urls = [u.strip().rstrip("/") for u in value.split(",") if u.strip()]
    for url in urls:
        if not url.startswith("http://"):
            raise ValueError(f"--exchange-siblings: {url!r} is not an http:// URL")
    return urls


# --- the supervisor (parent) ---

@dataclass
class _Worker:
    index: int
    argv: list[str]
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    quick_deaths: int = 0  # consecutive deaths soon after a start: the backoff exponent
    restart_at: float | None = None  # when a dead worker is started again
    stopped_pid: int = 0  # the process this worker's stop signal went to

    def start(self, env: dict[str, str], now: float) -> None:
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, env=env)
        self.started_at = now
        self.restart_at = None

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()


def _answers_health(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=1.0) as resp:
            return int(resp.status) == 200
    except (urllib.error.URLError, OSError):
        return False


class Supervisor:
    def __init__(self, base_argv: list[str], n: int,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.ports = free_private_ports(n)
        self.workers = [_Worker(i, child_argv(base_argv, i, self.ports)) for i in range(n)]
        self.stop_signal: int | None = None
        # one group per pod: the exchange relays another pod's batch to its siblings only
        self.env = {**os.environ, GROUP_ENV: secrets.token_hex(8)}

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.stop_signal = signum
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        """Once per worker process: a stop is a stop (its drain ignores repeats)."""
        for w in self.workers:
            if w.proc is not None and w.proc.poll() is None and w.stopped_pid != w.proc.pid:
                w.stopped_pid = w.proc.pid
                with contextlib.suppress(ProcessLookupError):
                    w.proc.send_signal(signum)

    def run(self, on_listening: Callable[[], None]) -> int:
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, self._on_signal)
        for w in self.workers:
            w.start(self.env, self.clock())
            log.info("worker %d: pid %d, private %s", w.index, w.proc.pid,  # type: ignore[union-attr]
                     private_url(self.ports[w.index]))
        rc = self._wait_started()
        if rc is not None:
            return rc
        on_listening()
        while self.stop_signal is None:
            self._tend()
            time.sleep(POLL_S)
        return self._stop()

    def _wait_started(self) -> int | None:
        """None once every worker answers /health; an exit code when one cannot start."""
        pending = set(range(len(self.workers)))
        deadline = time.monotonic() + START_TIMEOUT_S
        while pending:
            if self.stop_signal is not None:
                return self._stop()
            for i in sorted(pending):
                rc = self.workers[i].exit_code()
                if rc is not None:  # it printed its reason (a taken port, a bad flag)
                    log.info("worker %d exited with %d while starting", i, rc)
                    self._stop(signal.SIGTERM)
                    return rc or 1
                if _answers_health(private_url(self.ports[i])):
                    pending.discard(i)
            if time.monotonic() > deadline:
                print(f"kvfleet router: worker(s) {sorted(pending)} not up after "
                      f"{START_TIMEOUT_S:.0f} s", file=sys.stderr, flush=True)
                self._stop(signal.SIGTERM)
                return 1
            time.sleep(POLL_S)
        return None

    def _tend(self) -> None:
        """Schedule the restart of a worker that died, and start those that are due."""
        now = self.clock()
        for w in self.workers:
            rc = w.exit_code()
            if rc is not None and w.restart_at is None:
                lived = now - w.started_at
                w.quick_deaths = 0 if lived >= RESTART_RESET_AFTER_S else w.quick_deaths + 1
                delay = min(RESTART_BACKOFF_S * 2 ** max(w.quick_deaths - 1, 0),
                            RESTART_BACKOFF_MAX_S)
                w.restart_at = now + delay
                log.warning("worker %d (pid %d) exited with %s after %.1f s; restarting in "
                            "%.1f s", w.index, w.proc.pid, _describe(rc), lived,  # type: ignore[union-attr]
                            delay)
            elif rc is not None and w.restart_at is not None and now >= w.restart_at:
                try:
                    w.start(self.env, now)
                except OSError as exc:  # no process to be had (EAGAIN, ENOMEM): later
                    w.restart_at = now + RESTART_BACKOFF_MAX_S
                    log.error("worker %d cannot be started: %s; trying again in %.0f s",
                              w.index, exc, RESTART_BACKOFF_MAX_S)
                    continue
                log.warning("worker %d restarted: pid %d", w.index, w.proc.pid)  # type: ignore[union-attr]

    def _stop(self, signum: int | None = None) -> int:
        """Forward the stop (to a worker started since the signal too), wait for
        every worker's drain, SIGKILL what outlives STOP_GRACE_S. 0 when all exited 0."""
        self._forward(signum or self.stop_signal or signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        rc = 0
        for w in self.workers:
            if w.proc is None:
                continue
            try:
                code = w.proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                log.warning("worker %d (pid %d) still draining after %.0f s: killed", w.index,
                            w.proc.pid, STOP_GRACE_S)
                w.proc.kill()
                code = w.proc.wait()
            log.info("worker %d (pid %d) stopped: %s", w.index, w.proc.pid, _describe(code))
            if code != 0 and w.restart_at is None:
                rc = 1
        return rc


def _describe(rc: int) -> str:
    if rc < 0:
        with contextlib.suppress(ValueError):
            return f"signal {signal.Signals(-rc).name}"
    return f"code {rc}"


# `kvfleet router ARGS` in a fresh interpreter, however this one was started (the console
# script, `python -m`, or a caller of cli.main in-process: sys.orig_argv would be its own)


def supervise(argv: list[str], n: int, on_listening: Callable[[], None]) -> int:
    """Run N workers of `kvfleet router <argv>` until a stop signal; the exit code for the
    pod."""
    return Supervisor([sys.executable, "-c", RUN_ROUTER, *argv], n).run(on_listening)


# --- a worker's share (child) ---

def worker_app(app: RouterApp, token: str | None, siblings: list[str], *,
               private: tuple[str, int] | None = None, index: int = 0) -> web.Application:
    """Build a worker's aiohttp app: config pushes relay to the siblings, the siblings'
    newer config is taken at start, GET /admin/config and /metrics answer for the pod
    (worker_views.py), and the worker stops when the supervisor is gone. `siblings`: the
    other workers' private URLs in index order; `private`: this worker's own address;
    `index`: its --worker-index."""
    from aiohttp import ClientError, ClientSession, ClientTimeout

    from kvfleet_router.config import ConfigError, RouterConfig
    from kvfleet_router.config_store import StaleVersion
    from kvfleet_router.worker_views import PodViews

    auth = {"Authorization": f"Bearer {token}"} if token else {}
    parent = os.getppid()

    async def relay(body: bytes) -> None:
        timeout = ClientTimeout(total=RELAY_TIMEOUT_S)
        headers = {**auth, RELAY_HEADER: "1", "Content-Type": "application/json"}
        async with ClientSession(timeout=timeout) as session:
            async def one(url: str) -> None:
                try:
                    async with session.put(url + "/admin/config", data=body,
                                           headers=headers) as resp:
                        # 409: it already has this version or a newer one
                        if resp.status not in (200, 409):
                            log.warning("config relay to sibling %s: HTTP %d", url,
                                        resp.status)
                except (OSError, ClientError) as exc:  # TimeoutError is an OSError
                    log.warning("config relay to sibling %s failed: %s", url,
                                exc or "timeout")
            await asyncio.gather(*(one(u) for u in siblings))

    put_config = app.admin.put_config

    async def put_and_relay(request: web.Request) -> web.Response:
        resp = await put_config(request)
        # any 200, an identical re-push too: a sibling may have missed the first one
        if resp.status == 200 and RELAY_HEADER not in request.headers and siblings:
            await relay(await request.read())  # read() returns the body already read
        return resp

    # wrapped here, not in a middleware: the other requests pay nothing
    app.admin.put_config = put_and_relay  # type: ignore[method-assign]
    views = PodViews(app, token, siblings, index, private)
    app.admin.get_config = views.get_config  # type: ignore[method-assign]
    app.status.metrics_text = views.metrics_text  # type: ignore[method-assign]

    async def catch_up(_: web.Application) -> None:
        if not token or not siblings:
            return
        timeout = ClientTimeout(total=RELAY_TIMEOUT_S)
        async with ClientSession(timeout=timeout, headers=auth) as session:
            for url in siblings:
                try:
                    async with session.get(url + "/admin/config") as resp:
                        if resp.status != 200:
                            continue
                        got = json.loads(await resp.read())
                    cfg = RouterConfig.from_dict(got["config"])
                except (OSError, ClientError, ValueError, KeyError, TypeError, ConfigError):
                    continue  # starting too, or gone: the others, or the next push
                if cfg.version > app.store.current.version:
                    with contextlib.suppress(StaleVersion):
                        await app.store.push(cfg)
                        log.info("config version %d taken from sibling %s", cfg.version,
                                 url)

    async def watch_parent() -> None:
        while os.getppid() == parent:
            await asyncio.sleep(PARENT_CHECK_S)
        log.warning("the supervisor (pid %d) is gone: draining", parent)
        os.kill(os.getpid(), signal.SIGTERM)  # http_protocol.serve's graceful stop

    watch: list[asyncio.Task[None]] = []

    async def start_watch(_: web.Application) -> None:
        watch.append(asyncio.create_task(watch_parent()))

    async def stop_watch(_: web.Application) -> None:
        for task in watch:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    webapp = app.build()
    webapp.on_startup.append(catch_up)  # before the sockets open: up means up to date
    webapp.on_startup.append(start_watch)
    webapp.on_startup.append(views.start)
    webapp.on_cleanup.append(stop_watch)
    webapp.on_cleanup.append(views.close)
    return webapp
