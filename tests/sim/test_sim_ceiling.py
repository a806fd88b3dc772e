"""The attainment ceiling: prompts too long to prefill within the TTFT SLO even alone."""

from kvfleet_engine.runners.cost_model import load_profile
from kvfleet_sim.ceiling import attainment_ceiling, solo_ttft_s
from kvfleet_sim.trace import TraceRequest

PROFILE = load_profile("h100-llama3-8b")


def test_solo_ttft_is_the_cost_model_over_the_chunks():
    p = PROFILE
    one = solo_ttft_s(p, 8192, 8192)
    want = p.overhead_s + max(p.floor_s, p.prefill_s_per_token * 8192
                              + p.prefill_s_per_pair * (8192 * 8193 // 2)) \
        + p.s_per_kv_token * 8192  # fmt: skip
    assert abs(one - want) < 1e-12
    # The second chunk attends to the first: it costs more than the first alone.
    two = solo_ttft_s(p, 16384, 8192)
    assert two > 2 * one
    assert solo_ttft_s(p, 16384, 4096) > solo_ttft_s(p, 16384, 16384)  # per-step overhead


def test_the_ceiling_counts_only_prompts_that_cannot_make_it_alone():
    trace = [TraceRequest(0.0, n, 10, ()) for n in (1000, 30000, 38000, 40000, 126000)]
    # 38k tokens take just over 2 s on this profile; 40k and 126k more.
    assert attainment_ceiling(trace, PROFILE, 8192, 2.0) == 2 / 5
    assert attainment_ceiling(trace, PROFILE, 8192, 20.0) == 1.0
    assert attainment_ceiling([], PROFILE, 8192, 2.0) == 1.0
