"""The hostile corpus against one engine, with a good stream running throughout."""

from __future__ import annotations

import urllib.request

from corpus import cases_for
from hostile_client import (
    GOOD,
    GoodStreams,
    log_problems,
    run_corpus,
    stream_text,
    upload_cap_problems,
)
from hostile_fleet import start_engine


def test_corpus_against_an_engine(procs):
    engine = start_engine(procs)
    alone = stream_text(engine.url, GOOD)  # the reference: the same request, sent alone
    cases = cases_for("engine")
    assert len(cases) >= 100
    with GoodStreams(engine.url) as good:
        found = run_corpus(engine.port, cases)
        cap = upload_cap_problems(engine.port)
    assert found == {}, "\n".join(f"{cid}: {p}" for cid, p in found.items())
    assert cap == []
    assert good.errors == [] and len(good.results) >= 2
    assert all(r == alone for r in good.results), (alone, good.results)
    assert stream_text(engine.url, GOOD) == alone  # and still after
    assert urllib.request.urlopen(engine.url + "/health", timeout=5).status == 200
    assert log_problems(engine.log_text()) == []
