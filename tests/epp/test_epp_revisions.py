"""The Endpoint Picker front under a rollout's traffic split (kvfleet_router/revisions.py):
picks follow the weights exactly (the dispatcher's round-robin), the fallbacks named to the
gateway are from the primary's revision, and each answer the gateway reports is counted
under its revision (a 5xx as an error, TTFT to the response headers)."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

pytest.importorskip("grpc", reason="the epp extra (grpcio) is not installed")
pytest.importorskip("envoy.service.ext_proc.v3", reason="the epp extra (xds-protos) is missing")

import grpc  # noqa: E402
from epp_fixtures import start_epp  # noqa: E402
from extproc_client import (  # noqa: E402
    ExtProcClient,
    body_msg,
    completion_headers,
    headers_msg,
    response_headers_msg,
)
from kvfleet_router.revision_stats import RevisionCounts  # noqa: E402
from router_fixtures import admin_headers, http_json, start_fake  # noqa: E402

A, B = "aaaa111111", "bbbb222222"
GOOD = b'{"model": "m", "prompt": "hello", "max_tokens": 4}'


async def test_picks_split_by_weight_fallbacks_stay_in_revision_answers_counted(procs, tmp_path):
    fakes = [start_fake(procs, f"f{i}") for i in range(4)]
    revision = {f"127.0.0.1:{f.port}": (A if i < 2 else B) for i, f in enumerate(fakes)}
    epp = start_epp(procs, tmp_path, {
        "endpoints": [{"name": f"f{i}", "url": f.url, "revision": A if i < 2 else B}
                      for i, f in enumerate(fakes)],
        "revisions": {"weights": {A: 25, B: 75}}}, insecure=True, fallbacks=1)
    primaries: list[str] = []
    async with ExtProcClient(epp.epp_port) as c:
        for _ in range(20):
            call = c.open()
            out = await c.send(call, [headers_msg(completion_headers()), body_msg(GOOD)], [1, 1])
            assert out.pick is not None
            primary, fallback = out.pick.split(",")
            assert revision[primary] == revision[fallback], out.pick
            primaries.append(revision[primary])
            # the answer: A's first two fail with a 500 from the engine itself
            status = 500 if revision[primary] == A and primaries.count(A) <= 2 else 200
            await call.write(response_headers_msg(status, served=primary))
            await call.read()
            await call.done_writing()
            assert await call.read() is grpc.aio.EOF
    assert Counter(primaries) == {A: 5, B: 15}
    await asyncio.sleep(0.2)  # the picker settles each stream as it ends
    _, view = http_json(epp.url + "/admin/config", headers=admin_headers())
    ra, rb = (RevisionCounts.from_dict(view["revisions"][r]) for r in (A, B))
    assert (ra.requests, ra.errors, rb.requests, rb.errors) == (5, 2, 15, 0)
    assert (sum(ra.ttft), sum(rb.ttft)) == (3, 15)  # no TTFT for an error answer
