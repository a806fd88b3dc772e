"""The chaos soak's driver: a fleet, steady load, the schedule's faults one after another.

Each fault is injected at its scheduled time or once the fleet is back at full capacity
after the previous one, whichever is later; its recovery time runs from injection until
`ChaosFleet.full_capacity` holds again (and, for a killed process, its replacement is the
one serving). Then the load stops, and what the run left behind is checked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from kvfleet_operator.runtimes.local.procs import can_bind

from kvfleet_bench.chaos import netproxy
from kvfleet_bench.chaos import schedule as sch
from kvfleet_bench.chaos.fleet import ChaosFleet, engine_processes
from kvfleet_bench.chaos.load import SHAPES, SteadyLoad
from kvfleet_bench.chaos.report import FaultRecord, summarize

PROXY_MODES = {sch.NET_LATENCY: netproxy.LATENCY, sch.NET_DROP: netproxy.DROP,
               sch.NET_TRUNCATE: netproxy.TRUNCATE, sch.SCRAPE_GARBAGE: netproxy.GARBAGE_METRICS}


@dataclass(slots=True)
class SoakConfig:
    pool: Path
    work_dir: Path
    seed: int
    duration_s: float
    num_faults: int
    rate: float = 4.0
    model: str = "llama3-8b"
    num_engines: int = 3
    recovery_limit_s: float = 90.0
    kinds: tuple[str, ...] = sch.KINDS
    hang_margin_s: float = 5.0  # a hang lasts the router's idle timeout plus this
    router_b_overrides: dict[str, Any] | None = None
    faults: list[sch.Fault] | None = None  # a fixed schedule instead of a drawn one
    max_tokens: tuple[int, int] = (16, 48)  # each request's max_tokens, spread over this
    shapes: tuple[str, ...] = SHAPES
    load_routers: str = "ab"  # which router replicas the load goes through
    say: Callable[[str], None] = print


def _killpg(pid: int | None, sig: int) -> bool:
    if not pid:
        return False
    try:
        os.killpg(pid, sig)  # every replica leads its own process group
        return True
    except ProcessLookupError:
        return False


async def run_soak(cfg: SoakConfig) -> dict[str, Any]:
    fleet = ChaosFleet(cfg.pool, cfg.work_dir, router_b_overrides=cfg.router_b_overrides)
    try:
        return await _run(cfg, fleet)
    finally:
        fleet.kill_everything()
        await fleet.proxy.close()


async def _run(cfg: SoakConfig, fleet: ChaosFleet) -> dict[str, Any]:
    await fleet.proxy.start()
    fleet.start_up()
    fleet.start_router_b()
    timeout = aiohttp.ClientTimeout(total=5.0)
    async with aiohttp.ClientSession(timeout=timeout) as http:
        stop_mirror = asyncio.Event()

        async def mirror() -> None:
            tick = 0
            while not stop_mirror.is_set():
                await fleet.mirror_once(http)
                if tick % 4 == 0:
                    await fleet.scrape_migrations(http)
                tick += 1
                await asyncio.sleep(0.25)

        mirror_task = asyncio.create_task(mirror())

        async def at_full() -> bool:
            return await fleet.full_capacity(http, cfg.model, cfg.num_engines)

        await fleet.wait("the fleet at full capacity", at_full, 120)
        view = await fleet.admin_view(http, "a")
        assert view is not None
        idle_a = float(view["config"]["timeouts"]["idle_s"])
        idle_b = float(((cfg.router_b_overrides or {}).get("timeouts") or {}).get(
            "idle_s", idle_a))
        # A hang outlasts the idle timeout of every router replica the load goes through.
        idle_s = max(idle_a if "a" in cfg.load_routers else 0.0,
                     idle_b if "b" in cfg.load_routers else 0.0)
        faults = cfg.faults if cfg.faults is not None else sch.make_schedule(
            cfg.seed, cfg.duration_s, cfg.num_faults, num_engines=cfg.num_engines,
            hang_s=idle_s + cfg.hang_margin_s, kinds=cfg.kinds)
        cfg.say(f"fleet up (router idle timeout {idle_s:g}s); {len(faults)} faults over "
                f"{cfg.duration_s:g}s at {cfg.rate:g} req/s")
        urls = {"a": fleet.url_a, "b": fleet.url_b}
        load = SteadyLoad([urls[r] for r in cfg.load_routers], cfg.model, cfg.rate,
                          max_tokens=cfg.max_tokens, timeout_s=2 * idle_s + 30,
                          shapes=cfg.shapes)
        load_task = asyncio.create_task(load.run())
        await asyncio.sleep(0)
        records: list[FaultRecord] = []
        for i, fault in enumerate(faults):
            while load.now_s() < fault.at_s:
                await asyncio.sleep(min(0.2, fault.at_s - load.now_s()))
            record = await _inject(cfg, fleet, load, i, fault, at_full)
            records.append(record)
            rec = f"{record.recovery_s:.1f}s" if record.recovery_s is not None else "NOT"
            cfg.say(f"[{load.now_s():6.1f}s] fault {i + 1}/{len(faults)} {fault.kind} "
                    f"{record.target}: recovered in {rec}")
        while load.now_s() < cfg.duration_s:
            await asyncio.sleep(0.2)
        load.stop()
        outcomes = await load_task
        await fleet.mirror_once(http)
        await fleet.scrape_migrations(http)
        left_up = await fleet.leftovers_while_up(http)
        stop_mirror.set()
        await mirror_task
        run_s = load.now_s()
    exit_code = fleet.stop()
    await fleet.proxy.close()
    left_after = fleet.leftovers_after()
    versions = [v for _, v in fleet.a_versions]
    regressions = sum(1 for a, b in zip(versions, versions[1:], strict=False) if b < a)
    summary = summarize(outcomes, records, fleet.migrations)
    summary.update(
        wall_s=round(run_s, 1), rate=cfg.rate, idle_timeout_s=idle_s,
        num_engine_processes_after_loop_kills=sorted({
            r.num_engine_processes for r in records if r.num_engine_processes is not None}),
        num_delayed_faults=sum(1 for r in records if r.injected_s > r.scheduled_s + 1.0),
        up_starts=fleet.num_up_starts, router_a_version_regressions=regressions,
        router_a_last_version=versions[-1] if versions else None,
        router_b_pushes=fleet.num_b_pushes, proxy_faulted=fleet.proxy.num_faulted,
        up_exit_code=exit_code,
        leftovers={**left_up, **left_after},
    )
    return {"summary": summary, "schedule": [f.to_dict() for f in faults],
            "faults": [r.to_dict() for r in records],
            "failures": [o.to_dict() for o in outcomes if not o.is_ok][:200]}


async def _inject(cfg: SoakConfig, fleet: ChaosFleet, load: SteadyLoad, index: int,
                  fault: sch.Fault, at_full: Callable[[], Awaitable[bool]]) -> FaultRecord:
    engines = fleet.engines()
    target = ""
    in_flight = 0
    detail = ""
    observed: Callable[[], bool] = lambda: True  # noqa: E731 - the victim was replaced
    injected = load.now_s()
    if fault.kind in (sch.ENGINE_KILL, sch.ENGINE_HANG):
        victim = engines[fault.target % len(engines)]
        target, pid = victim["name"], victim["pid"]
        if fault.kind == sch.ENGINE_KILL:
            detail = "killed" if _killpg(pid, signal.SIGKILL) else "already gone"
            observed = lambda: (fleet.replica(target) or {}).get("pid") not in (pid, None)  # noqa: E731
        else:
            detail = "stopped" if _killpg(pid, signal.SIGSTOP) else "already gone"
            await asyncio.sleep(fault.duration_s)
            _killpg(pid, signal.SIGCONT)
    elif fault.kind == sch.ROUTER_KILL:
        router = fleet.replica("router") or {}
        target, pid = "router-a", router.get("pid")
        in_flight = load.in_flight[0] if cfg.load_routers.startswith("a") else 0
        detail = "killed" if _killpg(pid, signal.SIGKILL) else "already gone"
        observed = lambda: (fleet.replica("router") or {}).get("pid") not in (pid, None)  # noqa: E731
    elif fault.kind == sch.LOOP_KILL:
        target = "kvfleet-up"
        assert fleet.up is not None
        fleet.up.kill()
        await asyncio.to_thread(fleet.up.wait)
        await asyncio.sleep(fault.duration_s)
        # A restarted `up` takes its port back if the old router died with the loop.
        is_free = can_bind(fleet.port_a)
        detail = "router died with it" if is_free else "router outlived it"
        fleet.start_up(with_port=is_free)
    else:
        target = fleet.proxied_engine
        fleet.proxy.set_mode(PROXY_MODES[fault.kind])
        await asyncio.sleep(fault.duration_s)
        fleet.proxy.set_mode(netproxy.PASS)
    cleared = load.now_s()
    recovered = None
    deadline = time.monotonic() + cfg.recovery_limit_s
    while time.monotonic() < deadline:
        if observed() and await at_full():
            recovered = load.now_s()
            break
        await asyncio.sleep(0.2)
    num_engines = None
    if recovered is not None and fault.kind == sch.LOOP_KILL:
        num = num_engines = len(engine_processes(fleet.marker))
        if num != cfg.num_engines:
            cfg.say(f"fault {index + 1} loop_kill: {num} engine processes, "
                    f"{cfg.num_engines} expected")
    if recovered is None:
        cfg.say(f"fault {index + 1} {fault.kind}: not back at full capacity after "
                f"{cfg.recovery_limit_s:g}s")
        with contextlib.suppress(Exception):
            cfg.say(f"  state: {[(e['name'], e['state']) for e in fleet.engines()]}")
    return FaultRecord(index=index, kind=fault.kind, target=target, scheduled_s=fault.at_s,
                       injected_s=round(injected, 3), cleared_s=round(cleared, 3),
                       recovered_s=None if recovered is None else round(recovered, 3),
                       in_flight_on_victim=in_flight, detail=detail,
                       num_engine_processes=num_engines)
