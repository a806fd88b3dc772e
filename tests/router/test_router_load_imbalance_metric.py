"""`kvfleet_router_load_imbalance{role}`: (max q - min q) / mean q, q = queue depth
(in-flight + foreign load from a fresh scrape), over the endpoints a request of that role
may go to now, read from the router's own /metrics text."""

from __future__ import annotations

import concurrent.futures
import json
import random
import time
import urllib.request

import pytest
from engine_fleet import metric_sum
from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import Signals
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.router_core import RouterCore
from prometheus_client.parser import text_string_to_metric_families
from router_fixtures import endpoints_cfg, start_fake, start_router


def skewed_core() -> RouterCore:
    """Unified u0..u2 plus ones the metric must skip (draining, probe-failed, ejected),
    and a prefill pair."""
    names = [("u0", "unified", "active"), ("u1", "unified", "active"),
             ("u2", "unified", "active"), ("drain", "unified", "draining"),
             ("down", "unified", "active"), ("eject", "unified", "active"),
             ("p0", "prefill", "active"), ("p1", "prefill", "active")]
    cfg = RouterConfig.from_dict({"endpoints": [
        {"name": n, "url": f"http://127.0.0.1:{9000 + i}", "role": role, "state": state,
         "capacity": 16} for i, (n, role, state) in enumerate(names)]})
    core = RouterCore(cfg, rng=random.Random(0))
    eps = {e.name: e for e in core.registry.endpoints}
    for name, n in (("u0", 4), ("u1", 2), ("u2", 2), ("drain", 50), ("down", 30),
                    ("eject", 40), ("p0", 3), ("p1", 3)):
        eps[name].num_in_flight = n
    # u0's engine also runs 4 requests of other clients: q = 4 + 4 = 8 while the scrape is fresh
    eps["u0"].apply_scrape(Signals(num_running=6, num_waiting=2, scraped_at=1.0))
    eps["u0"].is_signals_fresh = True
    eps["down"].is_probe_healthy = False
    for _ in range(3):  # ejected at t=0 for health.eject_base_s (2 s), then half-open
        eps["eject"].breaker.record_failure(0.0)
    return core


def gauge(core: RouterCore, now: float) -> dict[str, float]:
    text = RouterMetrics(lambda: core, lambda: 0, clock=lambda: now).render().decode()
    family = next(f for f in text_string_to_metric_families(text)
                  if f.name == "kvfleet_router_load_imbalance")
    return {s.labels["role"]: s.value for s in family.samples}


def test_skewed_fleet_exports_max_minus_min_over_mean_of_queue_depth_per_role():
    core = skewed_core()
    # unified: q = [8, 2, 2] -> (8 - 2) / 4; draining, failed-probe and ejected ones skipped;
    # prefill: [3, 3] -> 0
    assert gauge(core, now=1.999) == {"unified": 1.5, "prefill": 0.0}


def test_an_ejected_endpoint_counts_again_the_instant_its_breaker_admits_a_trial():
    core = skewed_core()
    # at t = 2.0 "eject" is half-open (eligible): q = [8, 2, 2, 40] -> (40 - 2) / 13
    assert gauge(core, now=2.0)["unified"] == pytest.approx(38 / 13)


def test_a_stale_scrape_drops_the_foreign_load_and_an_idle_role_reads_zero():
    core = skewed_core()
    eps = {e.name: e for e in core.registry.endpoints}
    eps["u0"].is_signals_fresh = False  # unknown is not idle, but not load either: q = 4
    for name in ("p0", "p1"):
        eps[name].num_in_flight = 0
    assert gauge(core, now=1.0) == {"unified": pytest.approx((4 - 2) / (8 / 3)),
                                    "prefill": 0.0}


def test_a_router_process_exports_it_while_one_of_two_backends_holds_a_stream(procs, tmp_path):
    backends = [start_fake(procs, f"b{i}", "--token-delay-ms", "300") for i in range(2)]
    router = start_router(procs, tmp_path, {"endpoints": endpoints_cfg(backends),
                                            "policy": {"name": "round-robin"}})
    assert metric_sum(router.url, "kvfleet_router_load_imbalance", role="unified") == 0.0
    body = json.dumps({"prompt": "x", "max_tokens": 4, "stream": True}).encode()
    request = urllib.request.Request(router.url + "/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        held = pool.submit(lambda: urllib.request.urlopen(request, timeout=30).read())
        deadline = time.monotonic() + 10
        while metric_sum(router.url, "kvfleet_router_in_flight") != 1.0:
            assert time.monotonic() < deadline, "the stream never started"
            time.sleep(0.02)
        # q = [1, 0]: (1 - 0) / 0.5 (the fake backend's own running count is that request)
        assert metric_sum(router.url, "kvfleet_router_load_imbalance", role="unified") == 2.0
        held.result()
