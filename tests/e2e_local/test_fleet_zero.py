"""Scale to zero and back: an idle pool with min 0 drains its last replica away; the router
holds the next request while the autoscaler starts a replica for it, and it succeeds."""

import signal
import time

import openai
import pytest

pytestmark = pytest.mark.slow


def test_idle_pool_scales_to_zero_and_a_held_request_wakes_it(start_fleet):
    fleet = start_fleet("sim-zero.yaml")
    fleet.wait_ready("unified", 1)
    fleet.wait_for("scale to zero", lambda s: s.get("desired", {}).get("unified") == 0
                   and not fleet.replicas(s, "unified"), 30)

    client = openai.OpenAI(base_url=fleet.endpoint, api_key="unused", max_retries=0,
                           timeout=120)
    started = time.monotonic()
    reply = client.chat.completions.create(
        model="llama3-8b", messages=[{"role": "user", "content": "wake up"}], max_tokens=8)
    waited_s = time.monotonic() - started
    client.close()

    assert reply.choices[0].finish_reason in ("stop", "length")
    events = fleet.events()
    assert any("scale down 1->0" in e for e in events), events
    assert any("scale up 0->1: activate: 1 held request(s)" in e for e in events), events
    assert waited_s < 60
    assert fleet.stop(signal.SIGINT) == 0
    assert fleet.leftovers() == []
