"""The hostile corpus against a router in front of three engines, a good stream running
throughout: every case a 4xx, no engine ever ejected, the good stream token-exact."""

from __future__ import annotations

import json
import urllib.request

import hostile_client as hc
from corpus import ADMIN_TOKEN, cases_for
from hostile_fleet import start_engine, start_router


def _admin_view(router) -> dict:
    req = urllib.request.Request(router.url + "/admin/config",
                                 headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _metric(router, name: str) -> float:
    text = urllib.request.urlopen(router.url + "/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_corpus_against_a_router_in_front_of_three_engines(procs, tmp_path):
    engines = [start_engine(procs) for _ in range(3)]
    router = start_router(procs, tmp_path, engines)
    alone = hc.stream_text(router.url, hc.GOOD)
    cases = cases_for("router")
    assert len(cases) >= 100
    with hc.GoodStreams(router.url) as good:
        found = hc.run_corpus(router.port, cases)
        cap = hc.upload_cap_problems(router.port)
        # the barrage the issue found: pathological bodies, many times more than ejection needs
        barrage = [c for c in cases if c.code in ("json_too_deep", "number_too_long")] * 3
        found.update({f"barrage:{k}": v for k, v in hc.run_corpus(router.port, barrage).items()})
        view = _admin_view(router)  # while the good stream still runs
    assert found == {}, "\n".join(f"{cid}: {p}" for cid, p in found.items())
    assert cap == []
    assert [(e["name"], e["is_healthy"], e["state"]) for e in view["endpoints"]] == [
        (f"e{i}", True, "active") for i in range(3)]
    assert view["version"] == 1  # no nonsense push was applied
    assert _metric(router, "kvfleet_router_ejections_total") == 0
    assert _metric(router, "kvfleet_router_backend_errors_total") == 0
    assert good.errors == [] and len(good.results) >= 2
    assert all(r == alone for r in good.results), (alone, good.results)
    assert hc.stream_text(router.url, hc.GOOD) == alone
    for proc in [router, *engines]:
        assert hc.log_problems(proc.log_text()) == [], proc.log_text()[-3000:]


def test_engine_errors_caused_by_the_request_pass_through_without_ejection(procs, tmp_path):
    """Requests the router lets through but every engine refuses (4xx): many more than
    eject_after_errors, spread over all engines by round-robin; none is ejected."""
    engines = [start_engine(procs) for _ in range(3)]
    router = start_router(procs, tmp_path, engines)
    refused = [c for c in cases_for("router") if c.id.startswith("type-")]
    assert len(refused) >= 30
    assert hc.run_corpus(router.port, refused * 2) == {}
    view = _admin_view(router)
    assert all(e["is_healthy"] for e in view["endpoints"])
    assert _metric(router, "kvfleet_router_ejections_total") == 0
    assert _metric(router, "kvfleet_router_requests_total") >= len(refused)  # they did reach
    assert hc.stream_text(router.url, hc.GOOD) == hc.stream_text(engines[0].url, hc.GOOD)
