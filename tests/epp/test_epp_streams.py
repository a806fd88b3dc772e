"""The Endpoint Picker front over raw ext_proc streams (no Envoy): a real
`kvfleet router --epp-port` process in front of fake backends, spoken to as a gateway would.

* a good BUFFERED stream gets CONTINUE on its headers and the pick on its body, in the
  header and the `envoy.lb` metadata alike, with the fallbacks after the primary;
* bad streams (no body, body over the limit, malformed JSON, unknown model) get an
  ImmediateResponse in OpenAI's error shape, and a good stream open meanwhile is served;
* the subset hint limits the pick; 503 when nothing can serve, 429 (Retry-After) to shed;
* the request counts in flight from the pick to the stream's end, on whoever served;
* FULL_DUPLEX_STREAMED (GIE's reference mode): headers answered after the body, the body
  handed back; a body mode that cannot carry a pick is refused with a 500 naming it;
* gRPC health: liveness, readiness, the ext_proc service; TLS on the port;
* API keys (401) and quotas (429, x-ratelimit-*) as at the HTTP front; the key stays here.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request

import pytest

pytest.importorskip("grpc", reason="the epp extra (grpcio) is not installed")
pytest.importorskip("envoy.service.ext_proc.v3", reason="the epp extra (xds-protos) is missing")

import grpc  # noqa: E402
from epp_fixtures import TlsFiles, start_epp  # noqa: E402
from extproc_client import (  # noqa: E402
    MODE,
    ExtProcClient,
    body_msg,
    completion_headers,
    headers_msg,
    response_headers_msg,
)
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from helpers.procs import ProcessGroup  # noqa: E402
from router_fixtures import admin_headers, http_json, start_fake  # noqa: E402

LIMIT = 4096
GOOD = json.dumps({"model": "m", "prompt": "hello " * 20, "max_tokens": 4}).encode()


def base_cfg(fakes, **extra):
    cfg = {"endpoints": [{"name": f"b{i}", "url": f.url, "models": ["m"]}
                         for i, f in enumerate(fakes)],
           "limits": {"max_body_bytes": LIMIT},
           "queue": {"timeout_s": 0.3}}
    cfg.update(extra)
    return cfg


def addr(server) -> str:
    return f"127.0.0.1:{server.port}"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("epp")
    with ProcessGroup(tmp / "logs") as group:
        fakes = [start_fake(group, f"b{i}") for i in range(2)]
        tls = TlsFiles.make(tmp)
        epp = start_epp(group, tmp, base_cfg(fakes), tls=tls, fallbacks=1)
        yield fakes, epp, tls.cert.read_bytes()


def in_flight(epp, key: str = "num_in_flight") -> dict[str, int]:
    _, body = http_json(epp.url + "/admin/config", headers=admin_headers())
    return {e["name"]: e[key] for e in body["endpoints"]}


async def test_a_good_stream_gets_the_pick_in_header_and_metadata(fleet):
    fakes, epp, cert = fleet
    async with ExtProcClient(epp.epp_port, cert) as c:
        out = await c.exchange(completion_headers(), GOOD)
    assert out.kinds() == ["request_headers", "request_body"]
    assert out.immediate is None
    primary, fallback = out.pick.split(",")
    assert {primary, fallback} == {addr(f) for f in fakes}
    assert out.metadata == {"envoy.lb": {"x-gateway-destination-endpoint": out.pick}}


BAD = {
    "no body": (None, {}, 400, "missing_body"),
    "declared body over the limit": (b"{}", {"content-length": str(LIMIT + 1)}, 413,
                                     "body_too_large"),
    "body over the limit": (b'{"prompt": "' + b"x" * LIMIT + b'"}', {}, 413, "body_too_large"),
    "malformed JSON": (b'{"model": "m", "prompt": ', {}, 400, "invalid_json"),
    "unknown model": (json.dumps({"model": "nope", "prompt": "x"}).encode(), {}, 404,
                      "model_not_found"),
    "not an object": (b"[1, 2]", {}, 400, 400),
}


@pytest.mark.parametrize("case", list(BAD))
async def test_a_bad_stream_gets_an_openai_shaped_immediate_response(fleet, case):
    _, epp, cert = fleet
    body, extra, status, code = BAD[case]
    async with ExtProcClient(epp.epp_port, cert) as c:
        out = await c.exchange(completion_headers(**extra), body)
    assert out.immediate is not None, out.responses
    got_status, got_body, headers = out.immediate
    assert got_status == status
    assert headers["content-type"] == "application/json"
    err = got_body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code
    assert out.pick is None


async def test_bad_streams_leave_a_concurrent_good_stream_and_the_picker_alone(fleet):
    _, epp, cert = fleet
    async with ExtProcClient(epp.epp_port, cert) as c:
        good = c.open()  # a good request, its headers in, its body still to come
        await good.write(headers_msg(completion_headers()))
        assert (await good.read()).HasField("request_headers")

        async def bad(case: str):
            body, extra, status, _ = BAD[case]
            out = await c.exchange(completion_headers(**extra), body)
            return out.immediate[0] if out.immediate else None

        async def cut_short():  # a stream that just stops after its headers
            call = c.open()
            await call.write(headers_msg(completion_headers()))
            await call.read()
            call.cancel()

        results = await asyncio.gather(*[bad(k) for k in BAD for _ in range(5)],
                                       *[cut_short() for _ in range(5)])
        assert results[:len(BAD) * 5] == [BAD[k][2] for k in BAD for _ in range(5)]
        await good.write(body_msg(GOOD))
        reply = await good.read()
        assert reply.HasField("request_body")
        assert any(h.header.key == "x-gateway-destination-endpoint"
                   for h in reply.request_body.response.header_mutation.set_headers)
        await good.done_writing()
        out = await c.exchange(completion_headers(), GOOD)  # and the next one too
        assert out.pick is not None
    assert epp.server.is_running()


async def test_the_subset_hint_limits_the_pick(fleet):
    fakes, epp, cert = fleet
    only = addr(fakes[1])
    hint = {"envoy.lb.subset_hint": {"x-gateway-destination-endpoint-subset": [only]}}
    async with ExtProcClient(epp.epp_port, cert) as c:
        for i in range(6):
            body = json.dumps({"model": "m", "prompt": f"subset {i}"}).encode()
            out = await c.exchange(completion_headers(), body, metadata=hint)
            assert out.pick == only  # no fallback outside the subset either
        elsewhere = {"envoy.lb.subset_hint": {
            "x-gateway-destination-endpoint-subset": ["10.9.9.9:8000"]}}
        out = await c.exchange(completion_headers(), GOOD, metadata=elsewhere)
    assert out.immediate[0] == 503 and out.immediate[1]["error"]["code"] == "no_endpoint"


async def test_in_flight_from_the_pick_to_the_stream_end_on_whoever_served(fleet):
    fakes, epp, cert = fleet
    async with ExtProcClient(epp.epp_port, cert) as c:
        call = c.open()
        out = await c.send(call, [headers_msg(completion_headers()), body_msg(GOOD)], [1, 1])
        primary, fallback = out.pick.split(",")
        name = {addr(f): f"b{i}" for i, f in enumerate(fakes)}
        assert in_flight(epp) == {name[primary]: 1, name[fallback]: 0}
        assert in_flight(epp, "num_pending") == {name[primary]: 1, name[fallback]: 0}
        # the gateway's retry landed on the fallback: the request moves there, and its
        # response headers are the first byte the picker sees (pending no more)
        await call.write(response_headers_msg(200, served=fallback))
        reply = await call.read()
        assert list(reply.response_headers.response.header_mutation.remove_headers) == [
            "x-gateway-destination-endpoint-served"]
        assert in_flight(epp) == {name[primary]: 0, name[fallback]: 1}
        assert in_flight(epp, "num_pending") == {name[primary]: 0, name[fallback]: 0}
        await call.done_writing()
        assert await call.read() is grpc.aio.EOF
        await asyncio.sleep(0.2)
        assert in_flight(epp) == {name[primary]: 0, name[fallback]: 0}


async def test_full_duplex_streams_answer_headers_after_the_body(fleet):
    _, epp, cert = fleet
    half = len(GOOD) // 2
    async with ExtProcClient(epp.epp_port, cert) as c:
        call = c.open()
        fd = MODE.FULL_DUPLEX_STREAMED
        await call.write(headers_msg(completion_headers(), mode=fd, response_mode=fd))
        await call.write(body_msg(GOOD[:half], end=False))
        await call.write(body_msg(GOOD[half:], end=True))
        head, body = await call.read(), await call.read()
        assert head.HasField("request_headers") and head.HasField("dynamic_metadata")
        assert head.request_headers.response.header_mutation.set_headers[0].header.key == \
            "x-gateway-destination-endpoint"
        streamed = body.request_body.response.body_mutation.streamed_response
        assert streamed.body == GOOD and streamed.end_of_stream
        await call.write(response_headers_msg(200))
        assert (await call.read()).HasField("response_headers")
        await call.write(body_msg(b"data: x\n\n", end=True).__class__(
            response_body=body_msg(b"data: x\n\n", end=True).request_body))
        echoed = (await call.read()).response_body.response.body_mutation.streamed_response
        assert echoed.body == b"data: x\n\n" and echoed.end_of_stream
        await call.done_writing()


async def test_a_body_mode_that_cannot_carry_a_pick_is_refused_by_name(fleet):
    _, epp, cert = fleet
    async with ExtProcClient(epp.epp_port, cert) as c:
        call = c.open()
        out = await c.send(call, [headers_msg(completion_headers(), mode=MODE.STREAMED)], [1])
    status, body, _ = out.immediate
    assert status == 500 and body["error"]["code"] == "epp_misconfigured"
    assert "BUFFERED" in body["error"]["message"]


async def test_health_services_and_tls(fleet):
    _, epp, cert = fleet
    async with ExtProcClient(epp.epp_port, cert) as c:
        stub = health_pb2_grpc.HealthStub(c.channel)
        for name in ("", "liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            resp = await stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
            assert resp.status == health_pb2.HealthCheckResponse.SERVING, name
    async with ExtProcClient(epp.epp_port, None) as plain:  # TLS only
        with pytest.raises(grpc.aio.AioRpcError):
            await health_pb2_grpc.HealthStub(plain.channel).Check(
                health_pb2.HealthCheckRequest(service="liveness"), timeout=3)


async def test_nothing_to_serve_is_503_and_shedding_is_429(procs, tmp_path):
    fakes = [start_fake(procs, "b0")]
    cfg = base_cfg(fakes)
    cfg["endpoints"][0]["capacity"] = 1
    cfg["queue"] = {"max_size": 0, "timeout_s": 0.2, "retry_after_s": 3}
    epp = start_epp(procs, tmp_path, {**cfg, "version": 1}, insecure=True)
    async with ExtProcClient(epp.epp_port) as c:
        holder = c.open()  # holds the one slot
        out = await c.send(holder, [headers_msg(completion_headers()), body_msg(GOOD)], [1, 1])
        assert out.pick == addr(fakes[0])
        shed = await c.exchange(completion_headers(), GOOD)
        status, body, headers = shed.immediate
        assert (status, body["error"]["code"], headers["retry-after"]) == (429, "saturated", "3")
        holder.cancel()
        cfg["endpoints"][0]["state"] = "draining"
        cfg["queue"]["max_size"] = 4  # held 0.2 s (scale from zero waits here), then 503
        assert epp.push({**cfg, "version": 2}) == 200
        gone = await c.exchange(completion_headers(), GOOD)
    status, body, _ = gone.immediate
    assert (status, body["error"]["code"]) == (503, "no_endpoint")
    assert body["error"]["type"] == "server_error"


async def test_api_keys_and_quotas_apply_at_the_picker(procs, tmp_path):
    """The HTTP front's keys (401) and quotas (429 in OpenAI's shape, x-ratelimit-*), as
    immediate responses; the key never goes upstream."""
    fakes = [start_fake(procs, "b0")]
    keys = tmp_path / "api-keys.yaml"
    keys.write_text("sk-acme-0123456789: acme\n")
    cfg = base_cfg(fakes, quotas={"tenants": {"acme": {"rpm": 6}}})  # a bucket of 1 request
    epp = start_epp(procs, tmp_path, {**cfg, "version": 1}, insecure=True,
                    extra_args=("--api-keys-file", str(keys)))
    good = completion_headers(authorization="Bearer sk-acme-0123456789")
    async with ExtProcClient(epp.epp_port) as c:
        missing = await c.exchange(completion_headers(), GOOD)
        wrong = await c.exchange(
            completion_headers(authorization="Bearer sk-nope-0123456789"), GOOD)
        first = await c.exchange(good, GOOD)
        second = await c.exchange(good, GOOD)
    assert missing.immediate is not None and missing.immediate[0] == 401
    status, body, _ = wrong.immediate
    assert (status, body["error"]["code"]) == (401, "invalid_api_key")
    assert first.immediate is None and first.pick == addr(fakes[0])
    removed = [h for r in first.responses for h in
               r.request_body.response.header_mutation.remove_headers]
    assert removed == ["authorization"]
    status, body, headers = second.immediate
    assert (status, body["error"]["code"], body["error"]["type"]) == \
        (429, "rate_limit_exceeded", "requests")
    assert headers["x-ratelimit-limit-requests"] == "6"
    assert headers["x-ratelimit-remaining-requests"] == "0"
    assert int(headers["retry-after"]) >= 1
    with urllib.request.urlopen(epp.url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 'kvfleet_router_rejected_total{reason="quota-requests"} 1.0' in text
    assert ('kvfleet_router_flow_rejected_total{band="standard",reason="quota-requests",'
            'tenant="acme"} 1.0') in text  # per tenant: the throttling alert names it
