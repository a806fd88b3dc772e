"""bench/slo_model_calibration.py: the autoscaler's SLO model asked beside fleets pinned at N
replicas in the simulator."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kvfleet_bench.sections.slo_model_calibration import results_markdown, smallest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "slo_model_calibration.py"
TRACE = REPO.parent / "shared" / "traces" / "azure_llm_2023_code.csv"


@pytest.mark.skipif(not TRACE.exists(), reason="shared/traces not beside the repository")
def test_quick_run_pins_each_count_and_asks_the_model(tmp_path):
    out = tmp_path / "calib.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)],
                          capture_output=True, text=True, timeout=240, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    rows = result["slices"][0]["rows"]
    assert [r["count"] for r in rows] == [1, 2]
    one, two = rows
    # pinned: one replica serves the same requests worse than two
    assert one["measured"]["num_requests"] == two["measured"]["num_requests"] > 0
    assert one["measured"]["ttft_p90_s"] > two["measured"]["ttft_p90_s"]
    # the model was asked at ticks with load, and predicts worse for fewer replicas
    assert result["slices"][0]["prompt_tail"] > 1  # the p90 prompt is longer than the mean
    for r in rows:
        assert r["num_ticks_fleet_model"] > 0
        assert r["predicted"]["asked"]["p90"] >= 1
        # the routers export their prompts, so the processor-sharing candidate is priced
        assert r["predicted"]["ttft_p90_shared_s"] is not None
    assert (two["predicted"]["ttft_p90_shared_s"]["p50"]
            < one["predicted"]["ttft_p90_shared_s"]["p50"])
    assert one["predicted"]["ttft_p90_s"]["p90"] > two["predicted"]["ttft_p90_s"]["p90"]
    # the processor-sharing reference: the solo p90 stretched more on fewer replicas
    solo = result["slices"][0]["solo_ttft_p90_s"]
    assert one["shared_solo_ttft_p90_s"] > two["shared_solo_ttft_p90_s"] > solo
    assert "| 2 |" in out.with_suffix(".md").read_text()


def _row(count: int, ttft: float, itl: float, met: float) -> dict:
    return {"count": count, "slo": {"ttft_p90_s": 2.0, "itl_p90_s": 0.05},
            "measured": {"ttft_p90_s": ttft, "itl_p90_s": itl, "slo_attainment": met,
                         "prefix_hit_rate": 0.0},
            "predicted": {"ttft_p90_s": None, "itl_p90_s": None,
                          "asked": {"p50": 3, "p90": 5, "max": 6, "num_infeasible": 0}},
            "num_ticks_fleet_model": 10}


def test_smallest_count_counts_a_figure_at_the_target_as_met():
    rows = [_row(4, 2.001, 0.01, 0.9), _row(8, 2.0, 0.05, 0.95), _row(12, 1.0, 0.01, 0.99)]

    def within(m: dict, slo: dict) -> bool:
        return m["ttft_p90_s"] <= slo["ttft_p90_s"] and m["itl_p90_s"] <= slo["itl_p90_s"]

    assert smallest(rows, within) == "8"
    assert smallest(rows, lambda m, _slo: m["slo_attainment"] >= 0.99) == "12"
    assert smallest(rows[:1], within) == "none of these counts"
    text = results_markdown({"command": "c", "commit": "x", "duration_s": 600.0,
                             "warmup_s": 300.0, "startup_s": 10.0, "predict_quantile": 0.9,
                             "slices": [{"label": "L", "trace": "t", "start_s": 900.0,
                                         "pool": "p", "bar": 0.99, "rows": rows}]})
    assert "Smallest count measured within both targets: 8" in text
    assert "reached 99.0%: 12" in text
    assert "no fit" in text


def _bench():  # type: ignore[no-untyped-def]
    import importlib.util

    spec = importlib.util.spec_from_file_location("slo_model_calibration", SCRIPT)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench  # dataclasses look their module up there
    try:
        spec.loader.exec_module(bench)
    finally:
        del sys.modules[spec.name]
    return bench


def test_the_sharing_reference_stretches_by_one_over_one_less_rho_and_ends_at_rho_one():
    bench = _bench()
    floor = bench.PromptFloor(bar=0.99, solo_p90_s=1.0, solo_mean_s=0.5, request_rate=4.0)
    assert floor.shared_p90_s(4) == pytest.approx(2.0)  # rho 0.5
    assert floor.shared_p90_s(3) == pytest.approx(1.0 / (1.0 - 2.0 / 3.0))
    assert floor.shared_p90_s(2) == float("inf")  # rho 1: no steady state


def test_the_sharing_candidate_prices_the_quantile_prompt_and_the_mean_one():
    from kvfleet_operator.decide.slo_sizing import RoleLoad
    from kvfleet_router.perf_model import PROMPT_QUANTILES, RoleCoefficients

    bench = _bench()
    prompt = (2.0, 6.0, *(4.0 for _ in PROMPT_QUANTILES))  # mean 2 ktokens, quantiles 4
    # TTFT alone = 0.01 + 0.05 u: 0.21 s at 4 ktokens; the mean prompt's prefill 0.1 s
    w = RoleCoefficients((0.01, 0.05, 0.0, 0.0, 0.0, 0.0), (0.01, 0.0, 0.0), 100, 100, prompt)
    assert bench.shared_ttft_s(w, RoleLoad(request_rate=8.0), 2, 0.9) == pytest.approx(
        0.21 / (1 - 0.4))
    assert bench.shared_ttft_s(w, RoleLoad(request_rate=10.0), 1, 0.9) == float("inf")
    assert bench.shared_ttft_s(w, RoleLoad(request_rate=9.9), 1, 0.9) < float("inf")
    no_prompts = RoleCoefficients(w.ttft, w.tpot, 100, 100)
    assert bench.shared_ttft_s(no_prompts, RoleLoad(request_rate=8.0), 2, 0.9) is None
