"""The outlier-detection rule (fault.py): only an endpoint's own faults count against it.

A table over the rule itself, then the router as a real process in front of a fake backend
that answers 4xx, request-caused 5xx and plain 5xx: the first two never eject it."""

from __future__ import annotations

import json

import pytest
from engine_fleet import metric_sum
from kvfleet_engine.contract.http_limits import REQUEST_CAUSED_CODE
from kvfleet_router.fault import BUSY, CLIENT, ENDPOINT, OK, classify
from router_fixtures import admin_headers, endpoints_cfg, http_json, start_fake, start_router


def _err(code: object) -> bytes:
    return json.dumps({"error": {"message": "m", "type": "server_error", "param": None,
                                 "code": code}}).encode()


@pytest.mark.parametrize("status, body, verdict", [
    (200, b"{}", OK),
    (302, b"", OK),
    (400, _err(400), CLIENT),
    (401, b"", CLIENT),
    (404, b"not json", CLIENT),
    (413, b"", CLIENT),
    (422, _err("x"), CLIENT),
    (429, b"", BUSY),
    (503, _err(REQUEST_CAUSED_CODE), BUSY),  # busy stays busy: retried, never counted
    (500, _err(500), ENDPOINT),
    (500, b"", ENDPOINT),
    (500, b"<html>oops</html>", ENDPOINT),
    (500, _err(REQUEST_CAUSED_CODE), CLIENT),
    (502, _err(REQUEST_CAUSED_CODE), CLIENT),
    (504, _err("timeout"), ENDPOINT),
    (500, b'{"error": "caused_by_request"}', ENDPOINT),  # the marker is error.code, only
    (500, b'{"error": {"code": "caused_by_request"}' + b" " * 70000 + b"}", ENDPOINT),  # huge
    (500, b"[" * 5000, ENDPOINT),  # a pathological error body is no marker
    (501, b"", CLIENT),
    (505, b"", CLIENT),
])
def test_classify(status, body, verdict):
    assert classify(status, body) == verdict


def _healthy(router) -> dict[str, bool]:
    status, view = http_json(router.url + "/admin/config", headers=admin_headers())
    assert status == 200
    return {e["name"]: e["is_healthy"] for e in view["endpoints"]}


def _post(router) -> tuple[int, dict]:
    return http_json(router.url + "/v1/completions",
                     {"model": "fake", "prompt": "p", "max_tokens": 2})


def test_client_faults_never_eject_and_endpoint_faults_do(procs, tmp_path):
    backend = start_fake(procs, "b0")
    router = start_router(procs, tmp_path, {
        "endpoints": endpoints_cfg([backend]),
        "health": {"eject_after_errors": 2, "probe_interval_s": 60}})
    for injected in ({"status": 400, "error_code": "bad"},
                     {"status": 422, "error_code": "bad"},
                     {"status": 500, "error_code": REQUEST_CAUSED_CODE},
                     {"status": 502, "error_code": REQUEST_CAUSED_CODE}):
        assert http_json(backend.url + "/_fake/control", {**injected, "num_bad": 5})[0] == 200
        for _ in range(5):  # more than eject_after_errors in a row
            status, body = _post(router)
            # passed through as the engine sent it: not retried, not rewritten
            assert (status, body["error"]["code"]) == (injected["status"],
                                                        injected["error_code"]), body
        assert _healthy(router) == {"b0": True}, injected
    assert _post(router)[0] == 200
    assert metric_sum(router.url, "kvfleet_router_ejections_total") == 0
    assert metric_sum(router.url, "kvfleet_router_backend_errors_total") == 0
    # the control: the endpoint's own 500s (no marker) eject it after two
    assert http_json(backend.url + "/_fake/control",
                     {"status": 500, "error_code": 500, "num_bad": 2})[0] == 200
    for _ in range(2):
        assert _post(router)[0] >= 500
    assert _healthy(router) == {"b0": False}
    assert metric_sum(router.url, "kvfleet_router_ejections_total") == 1
