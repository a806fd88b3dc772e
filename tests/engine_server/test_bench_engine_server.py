"""Smoke run of bench/engine_server.py on the tiny model: it completes and reports ratios."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

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
    section = bench.markdown([report, report])
    assert section.count("<!-- engine_server -->") == 2
    readme = tmp_path / "README.md"
    readme.write_text("# B\n\n<!-- other -->\nx\n<!-- other -->\n")
    monkeypatch.setattr(bench, "README", readme)
    bench.update_readme(section)
    bench.update_readme(section)  # idempotent: replaces its own section
    text = readme.read_text()
    assert text.count("<!-- engine_server -->") == 2 and "<!-- other -->\nx\n" in text
