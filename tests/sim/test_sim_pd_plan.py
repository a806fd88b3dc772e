"""The router and the simulator run one P/D and peer-hint plan (kvfleet_router.pd_plan):
for the same requests both take the same legs, and when the plan's rule changes both
follow it. The router side is the real Disaggregator and Dispatcher over a forwarder that
records what it would send; the simulator side is a FleetSim replay."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from kvfleet_engine import contract
from kvfleet_operator.api import parse_pool
from kvfleet_router import pd_plan
from kvfleet_router.config import RouterConfig
from kvfleet_router.dispatch import Dispatcher
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.pd import Disaggregator
from kvfleet_router.peer_hint import REASONS
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore
from kvfleet_router.wait_queue import WaitQueue
from kvfleet_sim.fleet import FleetSim, SimSettings
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceRequest

POOLS = Path(__file__).resolve().parents[2] / "sim" / "pools"
THRESHOLD = 512  # the P/D pool's pd.prefill_threshold_tokens
LONG, SHORT = 4000, 200  # prompt tokens: above and under it


class RecordingForwarder:
    """What the router would send: the prefill leg's body, then the decode leg's."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, dict]] = []

    async def post_json(self, e, path, raw, headers):
        self.sent.append((e.name, json.loads(raw)))
        return 200, json.dumps({contract.KV_TRANSFER_PARAMS: {"remote_handle": "h"}}).encode()

    async def forward(self, request, e, raw, on_outcome, headers=None, ledger=None,
                      strip_ids=False, on_first_byte=None):
        self.sent.append((e.name, json.loads(raw)))
        return web.Response(text="ok")


def router_pieces(cfg: dict):
    """The router's real core, dispatcher and Disaggregator, wired as app.py wires them."""
    core = RouterCore(RouterConfig.from_dict(cfg), rng=random.Random(0))
    metrics = RouterMetrics(lambda: core, lambda: 0)
    feedback = HealthFeedback(metrics, lambda: core.cfg)
    forwarder = RecordingForwarder()
    dispatcher = Dispatcher(core, WaitQueue(8), metrics, forwarder, feedback)
    disaggregator = Disaggregator(core, dispatcher, forwarder, feedback, metrics)
    return core, dispatcher, disaggregator, metrics, forwarder


async def router_prefill_legs(num_tokens: int) -> int:
    """Prefill legs the router runs for one request of `num_tokens` prompt tokens."""
    _, _, disaggregator, _, forwarder = router_pieces({
        "endpoints": [{"name": "pre", "url": "http://127.0.0.1:1", "role": "prefill"},
                      {"name": "dec", "url": "http://127.0.0.1:2", "role": "decode"}],
        "pd": {"prefill_threshold_tokens": THRESHOLD}})
    body = {"model": "m", "prompt": list(range(1, num_tokens + 1)), "max_tokens": 4}
    info = RequestInfo(model="m", prompt_token_ids=body["prompt"], max_tokens=4, body=body)
    request = make_mocked_request("POST", "/v1/completions")
    await disaggregator.serve(request, json.dumps(body).encode(), info, None)
    legs = [name for name, _ in forwarder.sent]
    assert legs in (["dec"], ["pre", "dec"])
    kv = forwarder.sent[-1][1].get(contract.KV_TRANSFER_PARAMS)
    assert kv == ({"remote_handle": "h"} if legs == ["pre", "dec"] else None)
    return len(legs) - 1


def sim_prefill_legs(num_tokens: int) -> int:
    """Prefill legs the simulator runs for one request of `num_tokens` prompt tokens."""
    m = yaml.safe_load((POOLS / "h100-llama3-8b-pd.yaml").read_text())
    m["spec"]["topology"]["prefill"]["replicas"] = {"min": 1, "max": 1}
    m["spec"]["topology"]["decode"]["replicas"] = {"min": 1, "max": 1}
    m["spec"]["engine"]["maxModelLen"] = 32768
    pool = parse_pool(m)
    sim = FleetSim(pool, SCALERS["fixed-max"](pool.spec), SimSettings(startup_s=1.0))
    result = sim.run([TraceRequest(1.0, num_tokens, 4)])
    assert len(result.finished) == 1 and not result.finished[0].is_aborted
    assert sim.router.core.cfg.pd.prefill_threshold_tokens == THRESHOLD
    return result.num_prefill_legs


def never(role, decider, decode, has_prefill):
    return False


def always(role, decider, decode, has_prefill):
    return has_prefill


@pytest.mark.parametrize(("rule", "num_tokens", "num_legs"), [
    (None, LONG, 1), (None, SHORT, 0),  # the decider's own rule
    (never, LONG, 0), (always, SHORT, 1),  # the plan's rule replaced: both sides follow
])
async def test_the_router_and_the_simulator_take_the_legs_the_plan_decides(
        monkeypatch, rule, num_tokens, num_legs):
    calls: list[str] = []
    if rule is not None:
        def recorded(role, decider, decode, has_prefill):
            calls.append(decode.decision.endpoint.role)
            return rule(role, decider, decode, has_prefill)

        monkeypatch.setattr(pd_plan, "needs_prefill_leg", recorded)
    assert await router_prefill_legs(num_tokens) == num_legs
    assert sim_prefill_legs(num_tokens) == num_legs
    if rule is not None:
        assert calls[0] == "decode" and len(calls) == 2  # asked once by each side


def router_hint_counts() -> int:
    core, dispatcher, _, metrics, _ = router_pieces({
        "endpoints": [{"name": "e0", "url": "http://127.0.0.1:1", "engine": "builtin",
                       "prefix_mode": "precise"}],
        "kv_sharing": {"enabled": True}})
    info = RequestInfo(prompt_token_ids=list(range(1, 100)), body={"prompt": "p"})
    routed = core.route(info, "unified", 1.0)
    raw = b'{"prompt": "p"}'
    assert dispatcher.with_peer_hint(raw, info, routed, "unified") == raw  # nothing to fetch
    return int(sum(metrics.registry.get_sample_value("kvfleet_router_peer_hints_total",
                                                     {"reason": r}) or 0 for r in REASONS))


def sim_hint_counts() -> int:
    m = yaml.safe_load((POOLS / "h100-llama3-8b-16.yaml").read_text())
    spec = m["spec"]
    spec["topology"]["unified"]["replicas"] = {"min": 2, "max": 2}
    spec["engine"]["maxModelLen"] = 32768
    spec["routing"].update(policy="round-robin", prefixMode="precise",
                           kvSharing={"enabled": True})
    pool = parse_pool(m)
    sim = FleetSim(pool, SCALERS["fixed-max"](pool.spec), SimSettings())
    turns = [TraceRequest(1.0, 512 * 5, 4, (1, 2, 3, 4, 10)),
             TraceRequest(3.0, 512 * 5, 4, (1, 2, 3, 4, 11))]
    assert len(sim.run(turns).finished) == 2
    assert sim.fetches is not None
    return sum(sim.fetches.stats.hints.values())


def test_the_router_and_the_simulator_ask_for_a_peer_hint_when_the_plan_says(monkeypatch):
    assert router_hint_counts() == 1 and sim_hint_counts() == 2  # one per request
    monkeypatch.setattr(pd_plan, "asks_peer_hint", lambda core, routed, role: False)
    assert router_hint_counts() == 0 and sim_hint_counts() == 0
