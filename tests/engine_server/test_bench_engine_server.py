"""Smoke run of bench/engine_server.py on the tiny model: it completes and reports ratios."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from kvfleet_bench.sections.engine_server import render_engine_server

BENCH = Path(__file__).resolve().parents[2] / "bench" / "engine_server.py"


@pytest.mark.timeout(300)
def test_engine_server_bench_smoke(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("bench_engine_server", BENCH)
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # dataclasses look their module up
    spec.loader.exec_module(bench)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    out = tmp_path / "engine_server.json"
    assert bench.main(["--model", "tiny-random", "--concurrency", "1", "2", "--prompt-tokens",
                       "16", "--output-tokens", "4", "--requests-per-level", "3",
                       "--num-blocks", "64", "--rounds", "2", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [lvl["server"]["concurrency"] for lvl in report["levels"]] == [1, 2]
    for level in report["levels"]:
        for side in ("server", "offline"):
            assert level[side]["num_errors"] == 0 and level[side]["num_requests"] == 6
            assert level[side]["ttft_p50_ms"] > 0 and level[side]["itl_p50_ms"] > 0
        assert set(level["ratio"]) == {"wall", "ttft_p50", "itl_p50"}
    # its README section renders from the results it wrote (bench/kvfleet_bench/sections)
    section = render_engine_server({"engine_server": report, "engine_server_tiny": report})
    assert section.count("| streams | mode |") == 2
    assert "tiny-random" in section
