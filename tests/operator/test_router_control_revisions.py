"""The operator's router control reads each router's per-revision counters from GET
/admin/config (`revisions`) and sums them over router replicas; a malformed answer is a
RouterControlError like any other. Against the router's real admin API, in process."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from kvfleet_operator.loop.ports import RouterControlError, RouterView
from kvfleet_operator.runtimes.router_control import HttpRouterControl, combine_views, get_view
from kvfleet_router.app import RouterApp
from kvfleet_router.config import RouterConfig
from kvfleet_router.revision_stats import NUM_BUCKETS, RevisionCounts

A, B = "aaaa111111", "bbbb222222"
TOKEN = "t0ken"


def _counts(requests: int, errors: int, ttft_bucket: int = 3) -> RevisionCounts:
    return RevisionCounts(requests, errors,
                          [requests if i == ttft_bucket else 0 for i in range(NUM_BUCKETS)],
                          [0] * NUM_BUCKETS)


async def _router(counts: dict[str, RevisionCounts]) -> TestServer:
    """A real router app (its admin API) whose meter holds `counts`."""
    app = RouterApp(RouterConfig.from_dict({"endpoints": [
        {"name": "ea", "url": "http://127.0.0.1:1", "revision": A},
        {"name": "eb", "url": "http://127.0.0.1:2", "revision": B}]}), admin_token=TOKEN)
    for revision, c in counts.items():
        meter = app.admin.meter
        assert meter is not None
        got = meter.of(revision)
        assert got is not None
        got.requests, got.errors, got.ttft, got.itl = c.requests, c.errors, c.ttft, c.itl
    webapp = web.Application(middlewares=[app.admin.auth])  # the admin API alone
    app.admin.add_routes(webapp)
    server = TestServer(webapp)
    await server.start_server()
    return server


async def test_views_carry_each_routers_revisions_and_combine_sums_them():
    one = await _router({A: _counts(10, 1), B: _counts(90, 0)})
    two = await _router({A: _counts(5, 2, ttft_bucket=9)})
    try:
        async with aiohttp.ClientSession() as session:
            v1 = await get_view(session, str(one.make_url("")).rstrip("/"), TOKEN)
            assert v1.revisions == {A: _counts(10, 1), B: _counts(90, 0)}
            ctl = HttpRouterControl(session, [str(s.make_url("")).rstrip("/")
                                              for s in (one, two)], TOKEN)
            view = await ctl.view()
    finally:
        await one.close()
        await two.close()
    assert view is not None
    a = view.revisions[A]
    assert (a.requests, a.errors) == (15, 3)
    assert a.ttft[3] == 10 and a.ttft[9] == 5
    assert view.revisions[B] == _counts(90, 0)


def test_combine_views_without_revisions_is_empty():
    assert combine_views([RouterView(1), RouterView(2)]).revisions == {}


async def _answering(body: Any) -> TestServer:
    async def get(request: web.Request) -> web.Response:
        return web.json_response(body)

    webapp = web.Application()
    webapp.router.add_get("/admin/config", get)
    server = TestServer(webapp)
    await server.start_server()
    return server


BASE = {"version": 3, "endpoints": [{"name": "e", "state": "active", "num_in_flight": 0,
                                     "is_healthy": True}]}


async def test_a_router_without_revisions_reads_as_none():
    server = await _answering(BASE)  # an older router: no `revisions` key
    try:
        async with aiohttp.ClientSession() as session:
            view = await get_view(session, str(server.make_url("")).rstrip("/"), TOKEN)
    finally:
        await server.close()
    assert view.version == 3 and view.revisions == {}


@pytest.mark.parametrize(("revisions", "says"), [
    ([1, 2], "revisions must be an object"),
    ({A: "many"}, f"revisions['{A}']: revision counts must be an object"),
    ({A: {"requests": -1}}, "a count must be a non-negative integer"),
    ({A: {"requests": 1, "errors": 2}}, "errors (2) exceed requests (1)"),
    ({A: {"requests": 1, "ttft": [1, 2]}}, f"a histogram must list {NUM_BUCKETS}"),
])
async def test_malformed_revisions_are_a_router_control_error(revisions, says):
    server = await _answering({**BASE, "revisions": revisions})
    try:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(RouterControlError) as err:
                await get_view(session, str(server.make_url("")).rstrip("/"), TOKEN)
    finally:
        await server.close()
    assert "unexpected answer" in str(err.value) and says in str(err.value)
