"""Flow control at the dispatcher (in process, no sockets): when to queue (a stale scrape
is saturated), TTL expiry (429 + Retry-After while endpoints exist, 503 + a drop reason
when none), a gone client leaves the queue at once, the waiting room (a request sent
before any endpoint exists is dispatched once one is pushed), band order under saturation,
and the priority forwarded to engines."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from kvfleet_router.config import RouterConfig, SaturationConfig
from kvfleet_router.dispatch import DROP_REASON_HEADER, Dispatcher, Rejected
from kvfleet_router.endpoint import EndpointState, Signals
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.flow.saturation import admissible, is_saturated
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.request_info import RequestInfo, parse_request
from kvfleet_router.router_core import RouterCore
from kvfleet_router.wait_queue import WaitQueue

EP = {"name": "e0", "url": "http://127.0.0.1:1", "capacity": 1}


def _dispatcher(cfg: dict) -> tuple[Dispatcher, RouterCore, WaitQueue, RouterMetrics]:
    core = RouterCore(RouterConfig.from_dict(cfg))
    queue = WaitQueue(core.cfg.queue.max_size, core.cfg.flow_control)
    metrics = RouterMetrics(lambda: core, lambda: len(queue), band_lengths=queue.band_lengths)
    return (Dispatcher(core, queue, metrics, None, HealthFeedback(metrics, lambda: core.cfg)),  # type: ignore[arg-type]
            core, queue, metrics)


def _info(tenant: str = "default", priority: int = 0) -> RequestInfo:
    return RequestInfo(prompt_text="hello", tenant=tenant, priority=priority,
                       body={"prompt": "hello"})


# --- the saturation detector (flow/saturation.py) ---

def test_stale_scrape_is_saturated_never_scraped_is_the_cap_alone():
    cfg = SaturationConfig()
    e = EndpointState(name="e", url="http://x:1", capacity=4)
    assert not is_saturated(e, cfg)  # never scraped: judged by the in-flight cap
    e.apply_scrape(Signals(num_running=0, kv_usage=0.1, scraped_at=100.0))
    e.is_signals_fresh = True
    assert not is_saturated(e, cfg)
    e.is_signals_fresh = False  # the poller found the scrape too old: unknown
    assert is_saturated(e, cfg)
    assert admissible([e], "unified", 100.0, cfg) == (1, frozenset())


def test_fresh_signals_and_in_flight_decide():
    cfg = SaturationConfig(max_waiting=3, max_kv_usage=0.9)
    e = EndpointState(name="e", url="http://x:1", capacity=2)
    e.apply_scrape(Signals(num_waiting=3, scraped_at=1.0))
    e.is_signals_fresh = True
    assert is_saturated(e, cfg)
    e.apply_scrape(Signals(kv_usage=0.9, scraped_at=1.0))
    assert is_saturated(e, cfg)
    e.apply_scrape(Signals(kv_usage=0.5, scraped_at=1.0))
    assert not is_saturated(e, cfg)
    e.num_in_flight = 2
    assert is_saturated(e, cfg)


async def test_stale_endpoint_queues_then_expires_with_429_retry_after():
    d, core, queue, _ = _dispatcher({"endpoints": [EP], "queue": {"timeout_s": 0.3,
                                                                  "retry_after_s": 7}})
    e = core.registry.endpoints[0]
    e.apply_scrape(Signals(scraped_at=time.monotonic() - 60))  # stale: unknown, not idle
    t0 = time.monotonic()
    with pytest.raises(Rejected) as rej:
        await asyncio.wait_for(d.acquire(_info(), "unified", None, frozenset()), 5)
    resp = rej.value.response
    assert resp.status == 429 and resp.headers["Retry-After"] == "7"
    assert resp.headers[DROP_REASON_HEADER] == "saturated"
    assert 0.25 <= time.monotonic() - t0 < 2 and len(queue) == 0


async def test_no_endpoint_expires_with_503_and_reason():
    d, _, queue, metrics = _dispatcher({"queue": {"timeout_s": 0.2}})
    with pytest.raises(Rejected) as rej:
        await asyncio.wait_for(d.acquire(_info("acme"), "unified", None, frozenset()), 5)
    resp = rej.value.response
    assert resp.status == 503 and resp.headers[DROP_REASON_HEADER] == "no-endpoint"
    assert json.loads(resp.text)["error"]["code"] == "no_endpoint"
    assert b'kvfleet_router_flow_rejected_total{band="standard",reason="no-endpoint",' \
           b'tenant="acme"} 1.0' in metrics.render()


async def test_waiting_room_dispatches_once_an_endpoint_is_pushed():
    d, core, queue, metrics = _dispatcher({"queue": {"timeout_s": 10}})
    task = asyncio.create_task(d.acquire(_info(), "unified", None, frozenset()))
    await asyncio.sleep(0.2)
    assert not task.done() and len(queue) == 1  # held, not refused
    core.apply(RouterConfig.from_dict({"version": 1, "endpoints": [EP]}))
    queue.wake()  # what the config store's listener does on a push
    routed = await asyncio.wait_for(task, 2)
    assert routed.decision.endpoint is not None and routed.decision.endpoint.name == "e0"
    assert len(queue) == 0
    assert b'kvfleet_router_flow_queued_total{band="standard",tenant="default"} 1.0' \
        in metrics.render()


async def test_gone_client_leaves_the_queue_at_once():
    d, core, queue, metrics = _dispatcher({"endpoints": [EP], "queue": {"timeout_s": 30}})
    core.registry.endpoints[0].num_in_flight = 1  # full
    gone = False
    task = asyncio.create_task(d.acquire(_info(), "unified", None, frozenset(),
                                         is_gone=lambda: gone))
    await asyncio.sleep(0.15)
    assert len(queue) == 1
    gone = True
    with pytest.raises(Rejected) as rej:
        await asyncio.wait_for(task, 1)  # within a poll (0.1 s), not the 30 s TTL
    assert rej.value.response.headers[DROP_REASON_HEADER] == "client-gone"
    assert len(queue) == 0


async def test_cancelled_handler_leaves_the_queue():
    d, core, queue, _ = _dispatcher({"endpoints": [EP], "queue": {"timeout_s": 30}})
    core.registry.endpoints[0].num_in_flight = 1
    task = asyncio.create_task(d.acquire(_info(), "unified", None, frozenset()))
    await asyncio.sleep(0.05)
    assert len(queue) == 1
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert len(queue) == 0


async def test_higher_band_dispatched_first_when_capacity_frees():
    d, core, queue, _ = _dispatcher({
        "endpoints": [EP], "queue": {"timeout_s": 10},
        "flow_control": {"tenants": {"batch": {"band": "sheddable"},
                                     "pager": {"band": "critical"}}}})
    e = core.registry.endpoints[0]
    e.num_in_flight = 1
    order: list[str] = []

    async def one(tenant: str) -> None:
        routed = await d.acquire(_info(tenant), "unified", None, frozenset())
        order.append(tenant)
        assert routed.decision.endpoint is e

    batch = asyncio.create_task(one("batch"))
    await asyncio.sleep(0.05)
    pager = asyncio.create_task(one("pager"))
    await asyncio.sleep(0.05)
    d.release(e)  # one slot: the critical one, though it came second
    await asyncio.sleep(0.1)
    assert order == ["pager"]
    d.release(e)
    await asyncio.wait_for(asyncio.gather(batch, pager), 2)
    assert order == ["pager", "batch"]


def test_band_bound_answers_429_queue_full():
    async def run() -> Rejected:
        d, core, queue, _ = _dispatcher({
            "endpoints": [EP], "queue": {"timeout_s": 10},
            "flow_control": {"max_queued_per_band": {"sheddable": 0}}})
        core.registry.endpoints[0].num_in_flight = 1
        with pytest.raises(Rejected) as rej:
            await d.acquire(_info(priority=3), "unified", None, frozenset())
        return rej.value
    rej = asyncio.run(run())
    assert rej.response.status == 429 and rej.response.headers[DROP_REASON_HEADER] == "queue-full"


@pytest.mark.parametrize("tenant_band, priority, engine, forwarded", [
    ("standard", 0, "builtin", None),   # nothing to say: the body is forwarded untouched
    ("critical", 0, "builtin", -2),     # twice the band (seats.standing), not under share
    ("critical", 0, "vllm", None),      # vLLM only with forward_priority_to_vllm
    ("standard", -5, "unknown", 0),     # no request lifts itself above its tenant's band
    ("standard", 3, "builtin", 6),      # but may go lower
])
def test_priority_forwarded_to_the_engine(tenant_band, priority, engine, forwarded):
    d, _, _, _ = _dispatcher({"flow_control": {"tenants": {"t": {"band": tenant_band}}}})
    raw = json.dumps({"prompt": "hi"} | ({"priority": priority} if priority else {})).encode()
    info = parse_request(raw, "/v1/completions", {"x-kvfleet-tenant": "t"}, "x-session-id",
                         False)
    assert info.tenant == "t"
    e = EndpointState(name="e", url="http://x:1", engine=engine)
    out = d.with_priority(raw, info, e)
    if forwarded is None:
        assert out is raw
    else:
        assert json.loads(out)["priority"] == forwarded


# --- seats past the cap (flow/seats.py): the engine preempts for a tenant under its share ---

def _cap(n: int) -> dict:
    return {**EP, "capacity": n}


async def test_a_tenant_under_its_share_passes_a_cap_the_flood_holds():
    d, core, queue, _ = _dispatcher({"endpoints": [_cap(2)], "queue": {"timeout_s": 10}})
    e = core.registry.endpoints[0]
    flood = [await d.acquire(_info("flood"), "unified", None, frozenset()) for _ in range(2)]
    assert e.num_in_flight == 2 and [r.seat.standing for r in flood] == [0, 0]
    queued = asyncio.create_task(d.acquire(_info("flood"), "unified", None, frozenset()))
    await asyncio.sleep(0.05)
    assert len(queue) == 1  # the flood's third waits at the cap
    quiet = await asyncio.wait_for(d.acquire(_info("quiet"), "unified", None, frozenset()), 1)
    assert quiet.seat.standing == -1 and e.num_in_flight == 3  # past the cap, lifted
    raw = json.dumps({"prompt": "hello"}).encode()
    assert json.loads(d.with_priority(raw, _info("quiet"), e, quiet.seat))["priority"] == -1
    # at its share (1 of 2) it is no longer lifted: its second waits like anyone else
    second = asyncio.create_task(d.acquire(_info("quiet"), "unified", None, frozenset()))
    await asyncio.sleep(0.1)
    assert not second.done() and e.num_in_flight == 3
    for r in [*flood, quiet]:
        d.release(e, r.seat)
    await asyncio.wait_for(asyncio.gather(queued, second), 2)
    assert e.num_in_flight == 2


async def test_one_tenant_alone_never_passes_the_cap():
    d, core, queue, _ = _dispatcher({"endpoints": [_cap(2)], "queue": {"timeout_s": 10}})
    e = core.registry.endpoints[0]
    held = [await d.acquire(_info("a"), "unified", None, frozenset()) for _ in range(2)]
    d.release(e, held[0].seat)
    held[1:] += [await d.acquire(_info("a"), "unified", None, frozenset())]
    third = asyncio.create_task(d.acquire(_info("a"), "unified", None, frozenset()))
    await asyncio.sleep(0.1)
    assert not third.done() and e.num_in_flight == 2
    d.release(e, held[1].seat)
    await asyncio.wait_for(third, 1)
    assert e.num_in_flight == 2


async def test_critical_passes_a_cap_full_of_sheddable_seats_but_not_critical_ones():
    d, core, queue, _ = _dispatcher({
        "endpoints": [_cap(1)], "queue": {"timeout_s": 10},
        "flow_control": {"tenants": {"batch": {"band": "sheddable"},
                                     "pager": {"band": "critical"}}}})
    e = core.registry.endpoints[0]
    batch = await d.acquire(_info("batch"), "unified", None, frozenset())
    pager = await asyncio.wait_for(d.acquire(_info("pager"), "unified", None, frozenset()), 1)
    assert (batch.seat.standing, pager.seat.standing) == (2, -2) and e.num_in_flight == 2
    again = asyncio.create_task(d.acquire(_info("pager"), "unified", None, frozenset()))
    await asyncio.sleep(0.1)
    assert not again.done()  # a critical seat is not outranked by a critical request
    d.release(e, pager.seat)
    await asyncio.wait_for(again, 1)


async def test_seats_the_dispatcher_cannot_see_count_against_everyone():
    d, core, queue, _ = _dispatcher({"endpoints": [_cap(1)], "queue": {"timeout_s": 0.2},
                                     "flow_control": {"tenants": {"pager": {
                                         "band": "critical"}}}})
    core.registry.endpoints[0].num_in_flight = 1  # e.g. a P/D prefill leg: no seat
    with pytest.raises(Rejected):
        await d.acquire(_info("pager"), "unified", None, frozenset())


async def test_a_tenant_under_its_seat_share_passes_the_flood_queue_whatever_its_service():
    """The queue would put it behind the flood's head (more attained service, e.g. two
    requests close together), but on seats it outranks it does not wait for the flood."""
    d, core, queue, _ = _dispatcher({"endpoints": [_cap(4)], "queue": {"timeout_s": 10}})
    e = core.registry.endpoints[0]
    flood = [await d.acquire(_info("flood"), "unified", None, frozenset()) for _ in range(3)]
    first = await d.acquire(_info("quiet"), "unified", None, frozenset())
    assert first.seat.standing == -1  # 0 of its 2 seats
    queued = asyncio.create_task(d.acquire(_info("flood"), "unified", None, frozenset()))
    await asyncio.sleep(0.05)
    assert len(queue) == 1
    queue.charge("quiet", 1e6)  # far more service than the flood: last in the queue's order
    second = await asyncio.wait_for(d.acquire(_info("quiet"), "unified", None, frozenset()), 1)
    assert second.seat.standing == -1 and e.num_in_flight == 5 and not queued.done()
    # at its share (2 of 2) it outranks nothing: it waits in the queue like anyone else
    third = asyncio.create_task(d.acquire(_info("quiet"), "unified", None, frozenset()))
    await asyncio.sleep(0.1)
    assert not third.done() and len(queue) == 2
    for r in [*flood, first, second]:
        d.release(e, r.seat)
    await asyncio.wait_for(asyncio.gather(queued, third), 2)


async def test_every_queued_request_expires_with_503_when_no_endpoint_is_ready():
    """Not only the head: a request that never led the queue knows why too."""
    d, _, queue, _ = _dispatcher({"queue": {"timeout_s": 0.2}})
    tasks = [asyncio.create_task(d.acquire(_info("acme"), "unified", None, frozenset()))
             for _ in range(3)]
    results = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
    assert all(isinstance(r, Rejected) for r in results)
    assert [r.response.status for r in results] == [503, 503, 503]
    assert {r.response.headers[DROP_REASON_HEADER] for r in results} == {"no-endpoint"}
