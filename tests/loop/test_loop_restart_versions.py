"""A restarted control loop never sends the routers an older config version (issue 31,
item 3), even when it was killed between a push and the save that records it, or lost its
state: the routers here answer as the router's admin API does (a lower version is refused
with 409, the current version only as an identical re-push)."""

from pathlib import Path
from typing import Any

from fake_ports import Events, FakeClock, FakeMetrics, FakeRouters, FakeRuntime, MemoryStore
from fake_ports import SteeredScaler as Scaler
from kvfleet_operator.api import load_pool
from kvfleet_operator.loop.control_loop import ControlLoop
from kvfleet_operator.loop.events import EventReason
from kvfleet_operator.loop.ports import RouterControlError

POOL = Path(__file__).resolve().parents[1] / "e2e_local" / "pools" / "sim-unified.yaml"


class AdminRouters(FakeRouters):
    """Routers that keep what they run, and refuse what the admin API refuses."""

    def __init__(self) -> None:
        super().__init__(num_routers=2)
        self.accepted: list[int] = []  # every version any router took, in order

    async def push(self, config: dict[str, Any]) -> None:
        for current in self.configs:
            if current is None:
                continue
            ours, theirs = int(config["version"]), int(current["version"])
            same = {k: v for k, v in config.items() if k != "version"} == {
                k: v for k, v in current.items() if k != "version"}
            if ours < theirs or (ours == theirs and not same):
                raise RouterControlError(f"409 stale_version: {ours} (router runs {theirs})")
        self.configs = [config for _ in self.configs]
        self.accepted.append(int(config["version"]))


class ForgetfulStore(MemoryStore):
    """A store whose saves stop landing (the loop is killed before it saves)."""

    is_frozen: bool = False

    async def save(self, status: Any, loop: Any, view: dict[str, Any]) -> None:
        if not self.is_frozen:
            await super().save(status, loop, view)


def loop_for(store, runtime, routers, clock, scaler) -> tuple[ControlLoop, Events]:
    events = Events()
    loop = ControlLoop(load_pool(POOL), runtime=runtime, router=routers, metrics=FakeMetrics(),
                       store=store, events=events, clock=clock, scaler=scaler)  # fmt: skip
    return loop, events


async def ticks(loop: ControlLoop, clock: FakeClock, n: int) -> None:
    for _ in range(n):
        clock.t += 1.0
        await loop.tick()


async def test_a_loop_killed_between_push_and_save_pushes_above_the_routers():
    clock, routers, store = FakeClock(), AdminRouters(), ForgetfulStore()
    runtime, scaler = FakeRuntime(clock), Scaler({"unified": 3})
    first, _ = loop_for(store, runtime, routers, clock, scaler)
    await ticks(first, clock, 4)
    saved = store.saved.loop.router_config["version"]
    store.is_frozen = True  # the kill: what comes next is pushed but never saved
    routers.in_flight = {n: 1 for n in runtime.by_name}
    scaler.desired = {"unified": 2}
    await ticks(first, clock, 1)
    running = routers.configs[0]["version"]
    assert running > saved  # the routers run a config the store never heard of

    store.is_frozen = False
    second, events = loop_for(store, runtime, routers, clock, Scaler({"unified": 2}))
    await ticks(second, clock, 3)
    assert routers.accepted == sorted(routers.accepted)  # never backwards
    assert routers.accepted[-1] > running
    assert EventReason.ROUTER_PUSH_FAILED not in events.reasons()
    assert EventReason.ROUTER_VERSION_AHEAD in events.reasons()
    assert second.state.router_config == routers.configs[0]  # the loop knows what runs
    draining = {e["name"] for e in routers.configs[0]["endpoints"] if e["state"] == "draining"}
    assert draining == {n for n, s in runtime.states().items() if s == "draining"}


async def test_a_loop_that_lost_its_state_pushes_above_the_routers():
    clock, routers = FakeClock(), AdminRouters()
    runtime = FakeRuntime(clock)
    first, _ = loop_for(MemoryStore(), runtime, routers, clock, Scaler({"unified": 2}))
    await ticks(first, clock, 4)
    running = routers.configs[0]["version"]

    second, events = loop_for(MemoryStore(), runtime, routers, clock, Scaler({"unified": 3}))
    await ticks(second, clock, 4)
    assert routers.accepted == sorted(routers.accepted) and routers.accepted[-1] > running
    assert EventReason.ROUTER_PUSH_FAILED not in events.reasons()
    assert len(routers.configs[0]["endpoints"]) == 3  # the new loop's changes got through


def test_several_routers_report_their_oldest_and_newest_versions():
    from kvfleet_operator.loop.ports import RouterView
    from kvfleet_operator.runtimes.router_control import combine_views

    view = combine_views([RouterView(5), RouterView(3), RouterView(4)])
    assert (view.version, view.max_version) == (3, 5)  # re-push to 3; version above 5
    assert RouterView(7).max_version == 7
