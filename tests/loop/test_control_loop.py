"""The one control loop over fake ports: order of push and drain, restarts, events.

`kvfleet up` and `kvfleet sim` run this same `ControlLoop.tick()`; these tests pin down its
rules without processes or virtual time."""

from pathlib import Path

import pytest
from fake_ports import (
    Events,
    FakeClock,
    FakeMetrics,
    FakeRouters,
    FakeRuntime,
    MemoryStore,
    SteeredScaler,
)
from kvfleet_operator.api import load_pool
from kvfleet_operator.api.status import DecisionReason
from kvfleet_operator.loop.control_loop import ControlLoop
from kvfleet_operator.loop.events import EventReason
from kvfleet_operator.loop.ports import PortUnavailable

POOL = Path(__file__).resolve().parents[1] / "e2e_local" / "pools" / "sim-unified.yaml"
DRAIN_TIMEOUT = 10.0  # the pool's drainTimeoutSeconds


class Fleet:
    def __init__(self, num: int = 3, store: MemoryStore | None = None,
                 runtime: FakeRuntime | None = None, routers: FakeRouters | None = None,
                 clock: FakeClock | None = None) -> None:  # fmt: skip
        self.clock = clock or FakeClock()
        self.runtime = runtime or FakeRuntime(self.clock)
        self.routers = routers or FakeRouters()
        self.store = store or MemoryStore()
        self.events = Events()
        self.scaler = SteeredScaler({"unified": num})
        self.loop = ControlLoop(
            load_pool(POOL), runtime=self.runtime, router=self.routers, metrics=FakeMetrics(),
            store=self.store, events=self.events, clock=self.clock, scaler=self.scaler,
        )  # fmt: skip

    async def tick(self, dt: float = 1.0):
        self.clock.t += dt
        return await self.loop.tick()

    async def settle(self, num_ticks: int = 4) -> None:
        for _ in range(num_ticks):
            await self.tick()

    async def drain_one(self, in_flight: int) -> str:
        """Two ready replicas with `in_flight` requests each; scale to one: the victim."""
        await self.settle()
        self.routers.in_flight = {"unified-0": in_flight, "unified-1": in_flight}
        self.scaler.desired = {"unified": 1}
        await self.tick()
        (victim,) = [n for n, s in self.runtime.states().items() if s == "draining"]
        return victim


async def test_scales_up_and_pushes_every_ready_replica_to_every_router():
    fleet = Fleet(num=3)
    await fleet.settle()
    assert fleet.runtime.states() == {f"unified-{i}": "ready" for i in range(3)}
    for config in fleet.routers.configs:
        assert config is not None
        assert {e["name"]: e["state"] for e in config["endpoints"]} == {
            f"unified-{i}": "active" for i in range(3)}
    assert EventReason.LOOP_ERROR not in fleet.events.reasons()
    up = [e for e in fleet.events.events if e.reason == DecisionReason.SCALING_UP]
    assert up and up[0].message.startswith("scale unified: steered 1->3")
    status = fleet.loop.pool.status.roles["unified"]
    assert status.ready_replicas == 3 and status.last_scale_decision is not None
    assert status.last_scale_decision.reason == DecisionReason.SCALING_UP


async def test_a_failed_router_push_leaves_every_victim_serving():
    fleet = Fleet(num=3)
    await fleet.settle()
    fleet.routers.is_up[1] = False  # one of two routers is down: the push cannot complete
    fleet.scaler.desired = {"unified": 1}
    for _ in range(3):
        await fleet.tick()
    assert fleet.runtime.states() == {f"unified-{i}": "ready" for i in range(3)}
    assert fleet.runtime.deleted == []
    assert fleet.loop.state.drain_started == {}
    assert EventReason.ROUTER_PUSH_FAILED in fleet.events.reasons()
    assert fleet.events.reasons().count(EventReason.ROUTER_PUSH_FAILED) == 1  # said once

    fleet.routers.is_up[1] = True  # back: now the drain goes ahead
    fleet.routers.in_flight = {f"unified-{i}": 1 for i in range(3)}
    await fleet.tick()
    states = fleet.runtime.states()
    assert sorted(states.values()) == ["draining", "draining", "ready"], states
    draining = {n for n, s in states.items() if s == "draining"}
    for config in fleet.routers.configs:
        assert config is not None
        assert {e["name"] for e in config["endpoints"] if e["state"] == "draining"} == draining
    assert set(fleet.loop.state.drain_started) == draining


async def test_drained_replicas_stop_when_the_routers_report_nothing_in_flight():
    fleet = Fleet(num=2)
    victim = await fleet.drain_one(in_flight=3)
    await fleet.tick()
    assert fleet.runtime.deleted == []  # still busy in some router
    fleet.routers.in_flight[victim] = 0
    await fleet.tick()
    assert fleet.runtime.deleted == [victim]
    assert any(e.message.startswith(f"stop {victim} after") for e in fleet.events.events)
    assert EventReason.DRAIN_TIMED_OUT not in fleet.events.reasons()  # it emptied in time


async def test_an_unreadable_router_means_unknown_in_flight_so_only_the_timeout_stops():
    fleet = Fleet(num=2)
    victim = await fleet.drain_one(in_flight=1)
    started = fleet.loop.state.drain_started[victim]
    fleet.routers.is_view_broken = True  # nobody can say what is in flight
    fleet.routers.in_flight[victim] = 0
    fleet.clock.t = started + DRAIN_TIMEOUT - 0.5
    await fleet.tick(0.0)
    assert fleet.runtime.deleted == []
    fleet.clock.t = started + DRAIN_TIMEOUT
    await fleet.tick(0.0)
    assert fleet.runtime.deleted == [victim]
    timed_out = [e for e in fleet.events.events if e.reason == EventReason.DRAIN_TIMED_OUT]
    assert len(timed_out) == 1 and "unknown in flight" in timed_out[0].message


async def test_a_restarted_loop_keeps_drain_start_times_and_history():
    first = Fleet(num=2)
    victim = await first.drain_one(in_flight=2)  # a long request each
    started = first.loop.state.drain_started[victim]
    history = first.loop.state.history.to_dict()
    version = first.loop.state.router_config["version"]
    assert history["decisions"]

    # The control loop restarts; the replicas and routers live on (as pods do).
    second = Fleet(num=1, store=first.store, runtime=first.runtime, routers=first.routers,
                   clock=first.clock)  # fmt: skip
    assert second.loop.state.drain_started == {victim: started}
    assert second.loop.state.history.to_dict() == history
    assert second.loop.pool.status.roles["unified"].desired_replicas == 1
    first.clock.t = started + DRAIN_TIMEOUT - 1.0
    await second.tick(0.0)
    assert first.runtime.deleted == []  # the timer did not restart with the loop...
    first.clock.t = started + DRAIN_TIMEOUT
    await second.tick(0.0)
    assert first.runtime.deleted == [victim]  # ...and ends when it would have
    assert second.loop.state.router_config["version"] > version  # versions keep counting


async def test_a_router_that_restarted_gets_the_config_again():
    fleet = Fleet(num=2)
    await fleet.settle()
    pushed = fleet.routers.configs[0]
    assert pushed is not None
    fleet.routers.configs[1] = {**pushed, "version": 0, "endpoints": pushed["endpoints"]}
    await fleet.tick()
    assert fleet.routers.configs[1] == pushed


async def test_a_failing_tick_is_reported_once_and_the_loop_goes_on():
    import asyncio

    fleet = Fleet(num=1)
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("supervisor lost")

    fleet.runtime.supervise = broken  # type: ignore[method-assign]
    stop = asyncio.Event()
    ticks = 0

    def after() -> None:
        nonlocal ticks
        ticks += 1
        if ticks == 3:
            stop.set()

    fleet.loop.timing.tick_s = 0.01
    await fleet.loop.run(stop, after)
    assert calls == 3
    errors = [e for e in fleet.events.events if e.reason == EventReason.LOOP_ERROR]
    assert len(errors) == 1 and "supervisor lost" in errors[0].message
    assert errors[0].type == "Warning"


@pytest.mark.parametrize("before,after,is_panic,reason", [
    (2, 3, False, DecisionReason.SCALING_UP),
    (2, 5, True, DecisionReason.PANIC_SCALE_UP),
    (3, 2, False, DecisionReason.SCALING_DOWN),
    (1, 0, False, DecisionReason.SCALED_TO_ZERO),
    (0, 1, False, DecisionReason.ACTIVATED_FROM_ZERO),
    (2, 2, False, ""),
])  # fmt: skip
def test_decision_reasons_are_the_named_constants(before, after, is_panic, reason):
    from kvfleet_operator.decide.autoscaler import decision_reason

    assert decision_reason(before, after, is_panic) == reason


def test_the_crd_documents_every_decision_reason():
    from kvfleet_operator.api.status import DECISION_REASONS
    from kvfleet_operator.tools.crd_validate import CRD_PATH

    text = CRD_PATH.read_text()
    line = next(x for x in text.splitlines() if "Why the count moved" in x)
    assert all(reason in line for reason in DECISION_REASONS)


@pytest.mark.parametrize("error,has_traceback", [
    (RuntimeError("a bug"), True),
    (PortUnavailable("API server timed out"), False),
])  # fmt: skip
async def test_a_port_being_unavailable_is_one_line_and_a_bug_keeps_its_traceback(
    error, has_traceback, caplog
):
    import asyncio

    fleet = Fleet(num=1)

    async def broken() -> None:
        raise error

    fleet.runtime.supervise = broken  # type: ignore[method-assign]
    stop = asyncio.Event()
    fleet.loop.timing.tick_s = 0.01
    with caplog.at_level("ERROR"):
        await fleet.loop.run(stop, stop.set)
    (record,) = [r for r in caplog.records if "control loop error" in r.getMessage()]
    assert (record.exc_info is not None) is has_traceback
