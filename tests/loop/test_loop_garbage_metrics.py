"""Garbage metrics through the whole control loop (issue 31, item 3): replicas whose
`/metrics` answers garbage are unknown, never idle, so an idle-looking fleet is not scaled
down on them. The loop runs the real autoscaler and the real scrape edge
(`metrics_sources.scrape`) over a fake HTTP session."""

from pathlib import Path
from typing import Any

import pytest
from fake_ports import Events, FakeClock, FakeRouters, FakeRuntime, MemoryStore
from kvfleet_operator.api import load_pool
from kvfleet_operator.api.status import PoolStatus
from kvfleet_operator.loop.control_loop import ControlLoop
from kvfleet_operator.loop.ports import Saved
from kvfleet_operator.loop.state import LoopState
from kvfleet_operator.runtimes.metrics_sources import scrape

POOL = Path(__file__).resolve().parents[1] / "e2e_local" / "pools" / "sim-unified.yaml"

IDLE = ("vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        "vllm:kv_cache_usage_perc 0\n")  # fmt: skip
GARBAGE = {
    "html": "<html><body>502 Bad Gateway</body></html>",
    "nan": "vllm:num_requests_running 0\nvllm:num_requests_waiting NaN\n"
           "vllm:kv_cache_usage_perc 0\n",
    "negative": "vllm:num_requests_running -4\nvllm:num_requests_waiting 0\n"
                "vllm:kv_cache_usage_perc 0\n",
    "huge": "vllm:num_requests_running 0\nvllm:num_requests_waiting 1e300\n"
            "vllm:kv_cache_usage_perc 0\n",
}


class _Response:
    def __init__(self, body: str) -> None:
        self.status = 200
        self._body = body

    async def text(self) -> str:
        return self._body

    async def __aenter__(self) -> "_Response":
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None


class BodySession:
    """An aiohttp-like session answering each replica's /metrics with `bodies[name]`."""

    def __init__(self) -> None:
        self.bodies: dict[str, str] = {}

    def get(self, url: str, timeout: Any = None) -> _Response:
        name = url.removeprefix("http://fake.").split(":")[0]
        return _Response(self.bodies.get(name, IDLE))


class ScrapedMetrics:
    """The loop's MetricsSource over the real scrape edge."""

    def __init__(self, session: BodySession) -> None:
        self.session = session

    async def sample(self, replicas: Any, now: float) -> dict[str, Any]:
        return {r.name: await scrape(self.session, r.name, f"{r.address}/metrics", now)
                for r in replicas}  # fmt: skip


async def run(bodies_for: dict[str, str] | None, seconds: int = 30) -> tuple[dict, ControlLoop]:
    """Three replicas of an idle pool (min 1) for `seconds`: replica states, and the loop."""
    clock = FakeClock()
    runtime = FakeRuntime(clock)
    events = Events()
    session = BodySession()
    store = MemoryStore(saved=Saved(PoolStatus(), LoopState(desired={"unified": 3})))
    loop = ControlLoop(load_pool(POOL), runtime=runtime, router=FakeRouters(),
                       metrics=ScrapedMetrics(session), store=store, events=events,
                       clock=clock)  # fmt: skip
    for _ in range(seconds):
        if bodies_for is not None and runtime.by_name:
            session.bodies = {name: body for name, body in zip(
                sorted(runtime.by_name), bodies_for.values(), strict=False)}  # fmt: skip
        clock.t += 1.0
        await loop.tick()
    return runtime.states(), loop


async def test_an_idle_fleet_with_honest_metrics_scales_down():
    states, _ = await run(None)
    assert list(states.values()).count("ready") < 3, states  # the control


@pytest.mark.parametrize("shape", sorted(GARBAGE))
async def test_one_replica_with_garbage_metrics_holds_the_fleet(shape):
    states, loop = await run({"first": GARBAGE[shape]})
    assert states == {f"unified-{i}": "ready" for i in range(3)}, states
    assert loop.signals is not None
    rs = loop.signals.roles["unified"]
    assert (rs.num_known, rs.num_unknown) == (2, 1) and not rs.is_idle


async def test_every_replica_with_garbage_metrics_holds_the_fleet():
    states, _ = await run({f"r{i}": GARBAGE["html"] for i in range(3)})
    assert states == {f"unified-{i}": "ready" for i in range(3)}, states
