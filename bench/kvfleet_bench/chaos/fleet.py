"""The soak's fleet: `kvfleet up` (router replica A, the engines, the control loop) plus a
second router replica B that the soak runs itself, and the fault proxy in B's path.

A local fleet runs one router (`routing.replicas` is ignored locally; spec_support.py), so
replica B is a `kvfleet router` process whose config the soak mirrors from A's admin API,
as the control loop would push it to every replica of a Kubernetes pool: the same config
with B's own version counter, re-pushed when A's content changes or B lost it, and one
engine's URL replaced by the fault proxy's (the proxy follows that engine's address).

Every process started here inherits a marker in its environment, so after the run a scan of
/proc finds any survivor however it was started (as tests/e2e_local/e2e_fleet.py does).
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import secrets
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from kvfleet_operator.runtimes.local.procs import can_bind, free_port

from kvfleet_bench.chaos.netproxy import FaultProxy
from kvfleet_bench.procs import processes_with_env

MARKER_ENV = "KVFLEET_CHAOS_MARKER"
HOST = "127.0.0.1"


def kvfleet(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvfleet_operator.cli.main", *args]


def processes_with_marker(marker: str) -> list[int]:
    """Live processes this run marked (MARKER_ENV=marker)."""
    return processes_with_env(MARKER_ENV, marker)


def engine_processes(marker: str) -> list[int]:
    """Marked processes running `kvfleet engine` (duplicates show up here)."""
    found = []
    for pid in processes_with_marker(marker):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmd:
                argv = cmd.read().split(b"\0")
        except OSError:
            continue
        if b"engine" in argv and b"kvfleet_operator.cli.main" in argv:
            found.append(pid)
    return found


def migrations_from_metrics(text: str) -> dict[str, float]:
    """`kvfleet_router_migrations_total` by outcome from a router's /metrics text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("kvfleet_router_migrations_total{"):
            labels, _, value = line.rpartition(" ")
            outcome = labels.split('outcome="', 1)[-1].split('"', 1)[0]
            out[outcome] = out.get(outcome, 0.0) + float(value)
    return out


class ChaosFleet:
    def __init__(self, pool: Path, work_dir: Path, *, proxied_engine: str = "unified-0",
                 restart_backoff: float = 0.5, router_b_overrides: dict[str, Any] | None = None
                 ) -> None:  # fmt: skip
        self.pool = pool
        self.work_dir = work_dir
        self.state_dir = work_dir / "state"
        self.marker = uuid.uuid4().hex
        self.port_a = free_port()
        self.port_b = free_port()
        self.restart_backoff = restart_backoff
        self.proxied_engine = proxied_engine
        self.router_b_overrides = router_b_overrides or {}
        self.up: subprocess.Popen | None = None
        self.router_b: subprocess.Popen | None = None
        self.num_up_starts = 0
        self.token_b = secrets.token_urlsafe(24)
        self.proxy = FaultProxy(("127.0.0.1", 1))
        self.b_version = 0
        self._b_content: dict[str, Any] | None = None
        self.a_versions: list[tuple[float, int]] = []  # (monotonic, version) as A reported
        self.num_b_pushes = 0
        self.ports_seen: set[int] = set()
        self.migrations: dict[str, float] = {}  # summed over routers and their restarts
        self._last_metric: dict[int, dict[str, float]] = {}

    # --- processes --------------------------------------------------------------------------

    @property
    def url_a(self) -> str:
        return f"http://{HOST}:{self.port_a}"

    @property
    def url_b(self) -> str:
        return f"http://{HOST}:{self.port_b}"

    def _env(self) -> dict[str, str]:
        return {**os.environ, MARKER_ENV: self.marker}

    def start_up(self, with_port: bool = True) -> None:
        """`kvfleet up` on the state dir; `with_port=False` when router A still holds it."""
        self.work_dir.mkdir(parents=True, exist_ok=True)
        port = ["--port", str(self.port_a)] if with_port else []
        out = open(self.work_dir / f"up{self.num_up_starts}.out", "wb")  # noqa: SIM115
        self.num_up_starts += 1
        with out:
            self.up = subprocess.Popen(
                kvfleet("up", str(self.pool), "--state-dir", str(self.state_dir), *port,
                        "--restart-backoff", str(self.restart_backoff)),
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self._env(), start_new_session=True)

    def start_router_b(self) -> None:
        token_file = self.work_dir / "router-b-token"
        token_file.write_text(self.token_b)
        token_file.chmod(0o600)
        with open(self.work_dir / "router-b.log", "ab") as log:
            self.router_b = subprocess.Popen(
                kvfleet("router", "--host", HOST, "--port", str(self.port_b),
                        "--admin-token-file", str(token_file)),
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                env=self._env(), start_new_session=True)
        self._b_content = None

    def state(self) -> dict[str, Any]:
        try:
            return json.loads((self.state_dir / "state.json").read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def replica(self, name: str, state: dict[str, Any] | None = None) -> dict[str, Any] | None:
        state = state if state is not None else self.state()
        return next((r for r in state.get("replicas", []) if r["name"] == name), None)

    def engines(self, state: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        state = state if state is not None else self.state()
        return sorted((r for r in state.get("replicas", []) if r["role"] != "router"),
                      key=lambda r: r["name"])

    def token_a(self) -> str:
        try:  # `up` writes a new one at each start
            return (self.state_dir / "admin-token").read_text().strip()
        except OSError:
            return ""

    async def wait(self, what: str, predicate: Any, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if await predicate():
                return
            await asyncio.sleep(0.2)
        raise RuntimeError(f"timed out after {timeout_s:g}s waiting for {what} "
                           f"(see {self.work_dir})")

    # --- the routers' admin views ----------------------------------------------------------

    async def admin_view(self, http: aiohttp.ClientSession, which: str) -> dict[str, Any] | None:
        url, token = (self.url_a, self.token_a()) if which == "a" else (self.url_b, self.token_b)
        try:
            async with http.get(f"{url}/admin/config",
                                headers={"Authorization": f"Bearer {token}"}) as resp:
                return await resp.json() if resp.status == 200 else None
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None

    async def mirror_once(self, http: aiohttp.ClientSession) -> None:
        """Push A's config to B (B's own version), with the proxied engine behind the proxy."""
        view = await self.admin_view(http, "a")
        if view is None or not view.get("config") or int(view.get("version") or 0) <= 0:
            return  # a router replica just restarted holds no config until the loop pushes
        self.a_versions.append((time.monotonic(), int(view["version"])))
        config = copy.deepcopy(view["config"])
        for ep in config.get("endpoints", []):
            self.ports_seen.add(urlsplit(ep["url"]).port or 0)
            if ep["name"] == self.proxied_engine:
                parts = urlsplit(ep["url"])
                self.proxy.upstream = (parts.hostname or HOST, parts.port or 80)
                ep["url"] = self.proxy.url
        for section, values in self.router_b_overrides.items():
            config[section] = {**config.get(section, {}), **values}
        config.pop("version", None)
        b_view = await self.admin_view(http, "b")
        if b_view is None:
            return
        if config == self._b_content and b_view.get("version") == self.b_version:
            return
        self.b_version = max(self.b_version, int(b_view.get("version") or 0)) + 1
        try:
            async with http.put(f"{self.url_b}/admin/config",
                                json={**config, "version": self.b_version},
                                headers={"Authorization": f"Bearer {self.token_b}"}) as resp:
                if resp.status == 200:
                    self._b_content = config
                    self.num_b_pushes += 1
        except (aiohttp.ClientError, OSError, TimeoutError):
            pass

    async def scrape_migrations(self, http: aiohttp.ClientSession) -> None:
        """Sum the routers' migration counters, carrying on across a router's restart."""
        for which, url in ((0, self.url_a), (1, self.url_b)):
            try:
                async with http.get(f"{url}/metrics") as resp:
                    now = migrations_from_metrics(await resp.text())
            except (aiohttp.ClientError, OSError, TimeoutError):
                continue
            last = self._last_metric.get(which, {})
            for outcome, value in now.items():
                before = last.get(outcome, 0.0)
                delta = value - before if value >= before else value  # a restart reset it
                self.migrations[outcome] = self.migrations.get(outcome, 0.0) + delta
            self._last_metric[which] = now

    async def probe(self, http: aiohttp.ClientSession, url: str, model: str) -> bool:
        body = {"model": model, "prompt": "probe", "max_tokens": 2}
        try:
            async with http.post(f"{url}/v1/completions", json=body) as resp:
                return resp.status == 200 and bool((await resp.json())["choices"])
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError, KeyError):
            return False

    async def full_capacity(self, http: aiohttp.ClientSession, model: str,
                            num_engines: int) -> bool:
        """Every engine ready in status and active and healthy in both routers' views (under
        one name and URL each), the loop alive, and a probe answered through each router."""
        state = self.state()
        if self.up is None or self.up.poll() is not None or state.get("pid") != self.up.pid:
            return False
        engines = self.engines(state)
        if len(engines) != num_engines or any(e["state"] != "ready" for e in engines):
            return False
        router = self.replica("router", state)
        if router is None or router["state"] != "ready":
            return False
        urls = {e["name"]: e["address"] for e in engines}
        for which in ("a", "b"):
            view = await self.admin_view(http, which)
            if view is None:
                return False
            eps = {e["name"]: e for e in view["endpoints"]}
            if set(eps) != set(urls):
                return False
            for name, ep in eps.items():
                url = self.proxy.url if which == "b" and name == self.proxied_engine \
                    else urls[name]
                if ep["state"] != "active" or not ep["is_healthy"] or ep["url"] != url:
                    return False
        return all([await self.probe(http, self.url_a, model),
                    await self.probe(http, self.url_b, model)])

    # --- the end ----------------------------------------------------------------------------

    async def leftovers_while_up(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        """Before stopping: no replica or endpoint left draining, and each router's config
        names exactly the live engines."""
        state = self.state()
        names = {e["name"] for e in self.engines(state)}
        draining = [r["name"] for r in state.get("replicas", []) if r["state"] != "ready"]
        out: dict[str, Any] = {"replicas_not_ready": draining}
        for which in ("a", "b"):
            view = await self.admin_view(http, which) or {"endpoints": []}
            listed = {e["name"] for e in view["endpoints"]}
            out[f"router_{which}_endpoints_not_active"] = [
                e["name"] for e in view["endpoints"] if e["state"] != "active"]
            out[f"router_{which}_config_mismatch"] = sorted(listed ^ names)
        return out

    def stop(self) -> int | None:
        """SIGTERM `up` (it stops its children) and router B; returns up's exit code."""
        code = None
        if self.up is not None and self.up.poll() is None:
            self.up.send_signal(signal.SIGTERM)
            try:
                code = self.up.wait(60)
            except subprocess.TimeoutExpired:
                self.up.kill()
                code = self.up.wait()
        if self.router_b is not None and self.router_b.poll() is None:
            self.router_b.send_signal(signal.SIGTERM)
            try:
                self.router_b.wait(15)
            except subprocess.TimeoutExpired:
                self.router_b.kill()
                self.router_b.wait()
        return code

    def leftovers_after(self, wait_s: float = 5.0) -> dict[str, Any]:
        """After stopping: marked processes alive, ports still bound, state not stopped."""
        deadline = time.monotonic() + wait_s
        while True:
            alive = processes_with_marker(self.marker)
            if not alive or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        ports = sorted({self.port_a, self.port_b, self.proxy.port, *self.ports_seen} - {0})
        bound = [p for p in ports if not can_bind(p, HOST)]
        return {"processes": alive, "ports_checked": len(ports), "ports_bound": bound,
                "state_is_stopped": bool(self.state().get("is_stopped"))}

    def kill_everything(self) -> None:
        """Teardown whatever happened: nothing this fleet started survives it."""
        for proc in (self.up, self.router_b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        for pid in processes_with_marker(self.marker):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
