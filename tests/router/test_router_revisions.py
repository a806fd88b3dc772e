"""The router's side of a rollout (revisions.py): the config's revisions and weights, the
deterministic traffic split (checked at 5/95, 25/75 and 50/50 over 1,000 requests through
the real dispatcher), session stickiness, the fallbacks that never fail a request because
of the split, P/D legs that never pair revisions, and the per-revision measurements (GET
/admin/config, /metrics) over real processes."""

from __future__ import annotations

import asyncio
import json
import random
import urllib.request
from collections import Counter

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from kvfleet_engine import contract
from kvfleet_router.config import ConfigError, RouterConfig
from kvfleet_router.dispatch import Dispatcher
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.pd import Disaggregator
from kvfleet_router.proxy import BackendFailure
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.revision_stats import NUM_BUCKETS, RevisionCounts, bucket_of
from kvfleet_router.revisions import (
    MAX_DEPARTED_REVISIONS,
    RevisionCollector,
    RevisionMeter,
    RevisionSplit,
)
from kvfleet_router.router_core import RouterCore
from kvfleet_router.wait_queue import WaitQueue
from router_fixtures import admin_headers, http_json, start_fake, start_router

A, B = "aaaa111111", "bbbb222222"  # two engine revisions (revision_of's 10 hex digits)


def _eps(revision: str, n: int, role: str = "unified") -> list[dict]:
    return [{"name": f"{role[0]}-{revision[:4]}-{i}", "url": f"http://127.0.0.1:{i + 1}",
             "role": role, "revision": revision} for i in range(n)]


def _dispatcher(cfg: dict, forwarder: object = None) -> tuple[Dispatcher, RouterCore]:
    core = RouterCore(RouterConfig.from_dict(cfg), rng=random.Random(0))
    queue = WaitQueue(core.cfg.queue.max_size, core.cfg.flow_control)
    metrics = RouterMetrics(lambda: core, lambda: len(queue))
    return Dispatcher(core, queue, metrics, forwarder,  # type: ignore[arg-type]
                      HealthFeedback(metrics, lambda: core.cfg)), core


def _info(session: str | None = None) -> RequestInfo:
    return RequestInfo(prompt_text=f"hello {random.random()}", session_key=session,
                       body={"prompt": "hello"})


async def _served(d: Dispatcher, info: RequestInfo | None = None, role: str = "unified"):
    routed = await d.acquire(info or _info(), role, None, frozenset())
    e = routed.decision.endpoint
    assert e is not None
    d.release(e, routed.seat)
    return e


# --- the config ---

def test_revisions_config_round_trips_and_absent_means_no_split():
    cfg = RouterConfig.from_dict({"endpoints": _eps(A, 1) + _eps(B, 1),
                                  "revisions": {"weights": {A: 95, B: 5}}})
    assert [e.revision for e in cfg.endpoints] == [A, B]
    assert cfg.revisions is not None and cfg.revisions.weights == {A: 95, B: 5}
    assert RouterConfig.from_dict(cfg.to_dict()) == cfg
    plain = RouterConfig.from_dict({"endpoints": [{"name": "e", "url": "http://h:1"}]})
    assert plain.revisions is None and plain.endpoints[0].revision == ""
    assert RouterConfig.from_dict(plain.to_dict()) == plain


@pytest.mark.parametrize(("doc", "message"), [
    ({"revisions": {"weights": {A: 0, B: 0}}}, "revisions.weights: at least one revision"),
    ({"revisions": {"weights": {}}}, "revisions.weights: at least one revision"),
    ({"revisions": {"weights": {A: 101}}}, f"revisions.weights.{A}: must be an integer in "
                                           "[0, 100], got 101"),
    ({"revisions": {"weights": {A: -1}}}, "must be an integer in [0, 100], got -1"),
    ({"revisions": {"weights": {A: 50.0}}}, "must be an integer in [0, 100]"),
    ({"revisions": {"weights": {"Not_Hex": 1}}}, "revisions.weights.Not_Hex: the name must "
                                                 "match"),
    ({"revisions": {"weights": {"a" * 64: 1}}}, "the name must match ^[a-z0-9-]{1,63}$"),
    ({"revisions": {"weight": {A: 1}}}, "revisions.weight: unknown field"),
    ({"endpoints": [{"name": "e", "url": "http://h:1", "revision": "UP"}]},
     "endpoints[0].revision: must match"),
    ({"endpoints": [{"name": "e", "url": "http://h:1", "revision": "a" * 64}]},
     "endpoints[0].revision: must match ^[a-z0-9-]{0,63}$"),
])
def test_bad_revisions_are_refused_naming_the_field(doc, message):
    with pytest.raises(ConfigError) as err:
        RouterConfig.from_dict(doc)
    assert message in str(err.value)


# --- the split ---

@pytest.mark.parametrize(("wa", "wb"), [(5, 95), (25, 75), (50, 50), (1, 99)])
async def test_the_split_over_1000_requests_is_within_one_request_of_the_weights(wa, wb):
    d, _ = _dispatcher({"endpoints": _eps(A, 2) + _eps(B, 3),
                        "revisions": {"weights": {A: wa, B: wb}}})
    served = Counter([(await _served(d)).revision for _ in range(1000)])
    # smooth weighted round-robin: |n - w * N / 100| <= 1 (a random split at 5/95 strays
    # by ~7 requests: a test of +-1 fails it, as it fails a split that is ignored)
    assert abs(served[A] - wa * 10) <= 1 and abs(served[B] - wb * 10) <= 1, served
    # and at every prefix of the run, not just at the end
    split = RevisionSplit()
    split.configure(RouterConfig.from_dict({"revisions": {"weights": {A: wa, B: wb}}}).revisions)
    n_a = 0
    for n in range(1, 1001):
        n_a += split.assign() == A
        assert abs(n_a - wa * n / 100) < 1


def test_three_revisions_and_zero_weights():
    split = RevisionSplit()
    split.configure(RouterConfig.from_dict(
        {"revisions": {"weights": {A: 10, B: 30, "cccc333333": 60, "dddd444444": 0}}}).revisions)
    got = Counter(split.assign() for _ in range(1000))
    assert got == {A: 100, B: 300, "cccc333333": 600}  # weight 0: no new request at all


async def test_no_revisions_routes_over_every_endpoint_as_before():
    d, core = _dispatcher({"endpoints": _eps(A, 2) + _eps(B, 2)})
    assert d.follow_config().pools(core.registry.endpoints, None) == [core.registry.endpoints]
    info = _info()
    await _served(d, info)
    assert info.revision is None
    assert {(await _served(d)).revision for _ in range(40)} == {A, B}


async def test_a_session_keeps_its_revision_while_that_revision_has_weight():
    cfg = {"version": 1, "endpoints": _eps(A, 2) + _eps(B, 2),
           "revisions": {"weights": {A: 50, B: 50}}}
    d, core = _dispatcher(cfg)
    first = {s: (await _served(d, _info(s))).revision for s in ("s1", "s2", "s3", "s4")}
    assert set(first.values()) == {A, B}
    for _ in range(5):
        for s, rev in first.items():
            assert (await _served(d, _info(s))).revision == rev
    # B goes to 0: its sessions move to A (and stay there once B comes back)
    core.apply(RouterConfig.from_dict({**cfg, "version": 2,
                                       "revisions": {"weights": {A: 100, B: 0}}}))
    assert {(await _served(d, _info(s))).revision for s in first} == {A}
    core.apply(RouterConfig.from_dict({**cfg, "version": 3}))
    assert {(await _served(d, _info(s))).revision for s in first} == {A}


def test_the_session_table_is_bounded():
    split = RevisionSplit(max_sessions=3)
    split.configure(RouterConfig.from_dict({"revisions": {"weights": {A: 50, B: 50}}}).revisions)
    for i in range(10):
        split.assign(f"s{i}")
    assert list(split.sessions) == ["s7", "s8", "s9"]


async def test_a_revision_that_cannot_serve_falls_back_and_zero_weight_gets_nothing():
    d, core = _dispatcher({"endpoints": _eps(A, 1) + _eps(B, 1) + _eps("cccc333333", 1),
                           "revisions": {"weights": {A: 50, B: 50, "cccc333333": 0}}})
    eps = {e.revision: e for e in core.registry.endpoints}
    # weight 0 gets no new requests while a weighted revision can serve
    assert Counter([(await _served(d)).revision for _ in range(100)]) == {A: 50, B: 50}
    eps[B].is_probe_healthy = False  # B's only endpoint is down: its share goes to A
    assert Counter([(await _served(d)).revision for _ in range(100)]) == {A: 100}
    eps[A].capacity, eps[A].num_in_flight = 1, 1  # A saturated: not queued behind it
    got = await asyncio.wait_for(_served(d), 2)
    assert got is eps["cccc333333"]  # the last resort: never fail because of the split
    eps[A].num_in_flight = 0


async def test_retries_keep_the_assigned_revision_first():
    d, core = _dispatcher({"endpoints": _eps(A, 2) + _eps(B, 2),
                           "revisions": {"weights": {A: 50, B: 50}}})
    info = _info()
    first = await _served(d, info)
    routed = await d.acquire(info, "unified", None, frozenset({first.name}))
    assert routed.decision.endpoint.revision == first.revision  # its other endpoint
    assert routed.decision.endpoint is not first


# --- P/D never pairs revisions ---

class PairingForwarder:
    """Records every leg the router sends (by request), answering as an engine would;
    `fail_decode`: decode endpoints that fail before their first byte."""

    def __init__(self, fail_decode: frozenset[str] = frozenset()) -> None:
        self.legs: list[tuple[str, str]] = []  # (kind, endpoint name)
        self.fail_decode = fail_decode
        self.meter = None

    def counts_of(self, e):
        return None

    async def post_json(self, e, path, raw, headers):
        self.legs.append(("prefill", e.name))
        return 200, json.dumps({contract.KV_TRANSFER_PARAMS: {"remote_handle": e.name}}).encode()

    async def forward(self, request, e, raw, on_outcome, headers=None, ledger=None,
                      strip_ids=False, on_first_byte=None):
        kv = json.loads(raw).get(contract.KV_TRANSFER_PARAMS)
        self.legs.append(("decode", f"{e.name}<-{kv['remote_handle'] if kv else ''}"))
        if e.name in self.fail_decode:
            raise BackendFailure("connect", f"{e.name} unreachable")
        return web.Response(text="ok")


async def _pd_run(cfg: dict, n: int, forwarder: PairingForwarder) -> list[tuple[str, str]]:
    """(prefill endpoint or '', decode endpoint) of each request's served decode leg."""
    core = RouterCore(RouterConfig.from_dict(cfg), rng=random.Random(0))
    metrics = RouterMetrics(lambda: core, lambda: 0)
    feedback = HealthFeedback(metrics, lambda: core.cfg)
    d = Dispatcher(core, WaitQueue(64), metrics, forwarder, feedback)  # type: ignore[arg-type]
    pd = Disaggregator(core, d, forwarder, feedback, metrics)  # type: ignore[arg-type]
    pairs = []
    for i in range(n):
        prompt = f"{i} " + "word " * 200
        body = {"prompt": prompt, "max_tokens": 4}
        info = RequestInfo(prompt_text=prompt, max_tokens=4, body=body)
        forwarder.legs.clear()
        await pd.serve(make_mocked_request("POST", "/v1/completions"), json.dumps(body).encode(),
                       info, None)
        served = forwarder.legs[-1][1]
        decode, _, prefill = served.partition("<-")
        pairs.append((prefill, decode))
    return pairs


def _revision_of(name: str) -> str:
    return name.split("-")[1] if name else ""


@pytest.mark.parametrize("weights", [{A: 50, B: 50}, {A: 5, B: 95}, None])
async def test_pd_prefill_and_decode_always_come_from_one_revision(weights):
    cfg = {"endpoints": _eps(A, 2, "prefill") + _eps(B, 2, "prefill") + _eps(A, 2, "decode")
           + _eps(B, 2, "decode"), "pd": {"prefill_threshold_tokens": 0},
           "policy": {"name": "random"}}  # unrestricted, half the pairs would cross
    if weights:
        cfg["revisions"] = {"weights": weights}
    pairs = await _pd_run(cfg, 200, PairingForwarder())
    assert all(p for p, _ in pairs)  # every request had a prefill leg
    crossed = [(p, dec) for p, dec in pairs if _revision_of(p) != _revision_of(dec)]
    assert not crossed, crossed[:5]
    by_rev = Counter(_revision_of(dec) for _, dec in pairs)
    assert set(by_rev) == {"aaaa", "bbbb"}  # both revisions served, so pairing was tested
    if weights:
        assert by_rev["aaaa"] == weights[A] * 2


async def test_pd_without_a_prefill_endpoint_in_its_revision_decodes_alone():
    cfg = {"endpoints": _eps(A, 1, "prefill") + _eps(A, 1, "decode") + _eps(B, 1, "decode"),
           "pd": {"prefill_threshold_tokens": 0}, "revisions": {"weights": {A: 50, B: 50}}}
    pairs = await _pd_run(cfg, 20, PairingForwarder())
    assert sorted(set(pairs)) == [("", "d-bbbb-0"), ("p-aaaa-0", "d-aaaa-0")]


async def test_a_retried_decode_leg_tries_its_prefills_revision_first_else_drops_the_kv():
    cfg = {"endpoints": _eps(A, 1, "prefill") + _eps(B, 1, "prefill") + _eps(A, 2, "decode")
           + _eps(B, 1, "decode"), "pd": {"prefill_threshold_tokens": 0},
           "policy": {"name": "round-robin"}, "revisions": {"weights": {A: 50, B: 50}},
           "health": {"eject_after_errors": 1000}, "retries": {"max_attempts": 3}}
    # A's first decode fails: the retry takes A's other one, with the KV
    pairs = await _pd_run(cfg, 40, PairingForwarder(fail_decode=frozenset({"d-aaaa-0"})))
    assert set(pairs) == {("p-aaaa-0", "d-aaaa-1"), ("p-bbbb-0", "d-bbbb-0")}
    # both of A's fail: the retry goes to B without A's KV (computes the prompt itself)
    pairs = await _pd_run(cfg, 40, PairingForwarder(
        fail_decode=frozenset({"d-aaaa-0", "d-aaaa-1"})))
    assert set(pairs) == {("", "d-bbbb-0"), ("p-bbbb-0", "d-bbbb-0")}
    assert pairs.count(("", "d-bbbb-0")) == 20


# --- the measurements ---

def test_the_meter_exports_counters_and_histograms():
    meter = RevisionMeter()
    assert meter.of("") is None  # no revision: not counted
    c = meter.of(A)
    assert c is not None and meter.of(A) is c
    c.record(is_error=False)
    c.record(is_error=True)
    c.observe_ttft(0.04)
    c.observe_itl(0.012)
    c.observe_itl(0.5)
    assert RevisionCounts.from_dict(meter.to_dict()[A]) == RevisionCounts(
        2, 1, [int(i == bucket_of(0.04)) for i in range(NUM_BUCKETS)],
        [int(i in (bucket_of(0.012), bucket_of(0.5))) for i in range(NUM_BUCKETS)])
    from prometheus_client import CollectorRegistry, generate_latest
    registry = CollectorRegistry()
    registry.register(RevisionCollector(meter))
    text = generate_latest(registry).decode()
    assert f'kvfleet_router_revision_requests_total{{outcome="ok",revision="{A}"}} 1.0' in text
    assert f'kvfleet_router_revision_requests_total{{outcome="error",revision="{A}"}} 1.0' in text
    assert f'kvfleet_router_revision_ttft_seconds_bucket{{le="0.03",revision="{A}"}} 0.0' in text
    assert f'kvfleet_router_revision_ttft_seconds_bucket{{le="0.05",revision="{A}"}} 1.0' in text
    assert f'kvfleet_router_revision_itl_seconds_count{{revision="{A}"}} 2.0' in text
    assert f'kvfleet_router_revision_itl_seconds_sum{{revision="{A}"}} 0.512' in text
    meter.keep_only({B})  # A left the config: still readable, as one of the last departed
    assert list(meter.to_dict()) == [A]
    gone = [f"gone-{i}" for i in range(MAX_DEPARTED_REVISIONS)]
    for rev in gone:
        meter.of(rev)
    meter.keep_only({B})  # one departed too many: the oldest (A) is forgotten
    assert sorted(meter.to_dict()) == sorted(gone)
    meter.keep_only({B, gone[0]})  # back in the config: no longer departed
    assert meter.departed == gone[1:]


def _metric(text: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        if line.startswith(f"{name}{{{want}}} "):
            return float(line.split()[-1])
    return 0.0


def test_the_router_splits_and_measures_each_revision_over_http(procs, tmp_path):
    """Real router and fake engines: 40 requests at 25/75 go 10/30; each revision's
    attempts, errors (a 500 answer), TTFT and ITL are in GET /admin/config and /metrics."""
    a = start_fake(procs, "ea")
    b0, b1 = start_fake(procs, "eb0"), start_fake(procs, "eb1")
    cfg = {"version": 1, "endpoints": [
        {"name": "ea", "url": a.url, "revision": A},
        {"name": "eb0", "url": b0.url, "revision": B},
        {"name": "eb1", "url": b1.url, "revision": B}],
        "revisions": {"weights": {A: 25, B: 75}}, "retries": {"max_attempts": 1},
        "health": {"eject_after_errors": 100}}
    router = start_router(procs, tmp_path, cfg)

    def post(body: dict) -> int:
        req = urllib.request.Request(router.url + "/v1/completions",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                resp.read()
                return resp.status
        except urllib.error.HTTPError as exc:
            return exc.code

    for i in range(40):  # half streamed: every one of A's (the round-robin gives it i = 4k+1)
        assert post({"prompt": f"p{i}", "max_tokens": 4, "stream": i // 2 % 2 == 0}) == 200
    logs = {n: len(http_json(s.url + "/_fake/log")[1]["log"])
            for n, s in (("ea", a), ("eb0", b0), ("eb1", b1))}
    assert logs["ea"] == 10 and logs["eb0"] + logs["eb1"] == 30, logs
    assert http_json(a.url + "/_fake/control", {"status": 500, "num_bad": 2})[0] == 200
    statuses = [post({"prompt": f"q{i}", "max_tokens": 4}) for i in range(8)]
    assert statuses.count(500) == 2  # A's two requests of the 8 fail (no retry)
    status, view = http_json(router.url + "/admin/config", headers=admin_headers())
    assert status == 200
    assert {e["name"]: e["revision"] for e in view["endpoints"]} == {
        "ea": A, "eb0": B, "eb1": B}
    ra, rb = (RevisionCounts.from_dict(view["revisions"][r]) for r in (A, B))
    assert (ra.requests, ra.errors, rb.requests, rb.errors) == (12, 2, 36, 0)
    # TTFT: every answer but the failed ones; ITL: the gaps between a stream's chunks (4
    # tokens 2 ms apart, then [DONE]; fewer gaps when chunks coalesce), 10 streams on A
    assert sum(ra.ttft) == 10 and sum(rb.ttft) == 36
    assert 10 <= sum(ra.itl) <= 50 and 0.001 < ra.itl_p90() < 0.1
    text = urllib.request.urlopen(router.url + "/metrics").read().decode()
    assert _metric(text, "kvfleet_router_revision_requests_total", revision=A,
                   outcome="error") == 2
    assert _metric(text, "kvfleet_router_revision_requests_total", revision=B,
                   outcome="ok") == 36
    assert _metric(text, "kvfleet_router_revision_ttft_seconds_count", revision=B) == 36
    assert _metric(text, "kvfleet_router_revision_itl_seconds_count",
                   revision=A) == sum(ra.itl)
