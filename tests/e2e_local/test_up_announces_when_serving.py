"""`kvfleet up` prints its endpoint only once the router can serve: a request sent the moment
the endpoint line appears succeeds (before, it waited 5 s and got 503 "no healthy endpoint"),
and the router's URL is printed nowhere before that line (issue 28: "router ready on
http://..." came first)."""

import json
import re
import time
import urllib.request

import pytest

pytestmark = pytest.mark.slow

ANNOUNCE = re.compile(r"OpenAI endpoint (http://127\.0\.0\.1:\d+/v1)")


def _first_announcement(fleet, timeout_s=90.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        match = ANNOUNCE.search(fleet.output())
        if match:
            return match.group(1)
        assert fleet.proc.poll() is None, fleet.output()[-2000:]
        time.sleep(0.01)
    raise AssertionError(f"no endpoint announced:\n{fleet.output()[-2000:]}")


@pytest.mark.parametrize("pool,model", [("sim-unified.yaml", "llama3-8b"),
                                        ("sim-pd.yaml", "llama3-8b")])  # fmt: skip
def test_the_first_request_at_the_announcement_succeeds(start_fleet, pool, model):
    fleet = start_fleet(pool)
    endpoint = _first_announcement(fleet)
    body = json.dumps({"model": model, "prompt": "hello " * 40, "max_tokens": 4}).encode()
    req = urllib.request.Request(f"{endpoint}/completions", data=body,
                                 headers={"content-type": "application/json"})
    started = time.monotonic()
    with urllib.request.urlopen(req, timeout=30) as resp:
        assert resp.status == 200
        answer = json.loads(resp.read())
    assert answer["usage"]["completion_tokens"] == 4
    assert time.monotonic() - started < 5.0  # served, not held until a replica came up
    lines = fleet.output().splitlines()
    announced = next(i for i, line in enumerate(lines) if ANNOUNCE.search(line))
    # Every role had a ready replica before the endpoint was announced.
    roles = {"sim-unified.yaml": ["unified"], "sim-pd.yaml": ["prefill", "decode"]}[pool]
    for role in roles:
        assert any(re.search(rf"{role}-\d+ ready on", line) for line in lines[:announced])
    # The router's URL appears once, in the announcement (no "router ready on http://...").
    router_url = re.compile(re.escape(endpoint.removesuffix("/v1")) + r"(?!\d)")
    assert [i for i, line in enumerate(lines) if router_url.search(line)] == [announced]
    assert any(line.endswith("router ready") for line in lines[:announced])
