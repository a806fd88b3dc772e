"""Prefill/decode pools: the router's P/D path (decode first, a prefill leg when the
uncached prompt is long enough), the KV hand-off as bytes over a link, and separate
prefill and decode autoscaling through the real autoscaler."""

from pathlib import Path

import pytest
import yaml
from kvfleet_operator.api import parse_pool
from kvfleet_router.perf_model import ttft_features
from kvfleet_sim.fleet import FleetSim, SimError, SimSettings
from kvfleet_sim.handoff import Handoff
from kvfleet_sim.report import summarize
from kvfleet_sim.scalers import SCALERS
from kvfleet_sim.trace import TraceRequest

ROOT = Path(__file__).resolve().parents[2]

PD_POOL = ROOT / "sim" / "pools" / "h100-llama3-8b-pd.yaml"
KV_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # Llama-3-8B, bf16: K and V


def pd_pool(prefill=(1, 1), decode=(2, 2), **routing):
    m = yaml.safe_load(PD_POOL.read_text())
    m["spec"]["topology"]["prefill"]["replicas"] = dict(zip(("min", "max"), prefill, strict=True))
    m["spec"]["topology"]["decode"]["replicas"] = dict(zip(("min", "max"), decode, strict=True))
    m["spec"]["engine"]["maxModelLen"] = 32768
    m["spec"]["routing"].update(routing)
    return parse_pool(m)


def replay(pool, trace, scaler="fixed-max", **settings):
    sim = FleetSim(pool, SCALERS[scaler](pool.spec), SimSettings(startup_s=2.0, **settings))
    return sim, sim.run(trace)


def test_long_uncached_prompts_take_a_prefill_leg_and_pay_the_hand_off():
    trace = [TraceRequest(i * 2.0, 4000, 8) for i in range(6)]  # one at a time, distinct
    ttft = {}
    for bw in (1e9, 1e12):
        sim, result = replay(pd_pool(), trace, kv_bytes_per_s=bw, kv_latency_s=0.0)
        assert result.num_prefill_legs == len(trace)
        assert len(result.finished) == 6 and not any(f.is_aborted for f in result.finished)
        assert {f.replica for f in result.finished} <= {"decode-1", "decode-2"}
        prefill = sim.runtime.by_name["prefill-0"]
        assert prefill.engine.stats().num_prompt_tokens == 6 * 4000  # prefill computed them
        assert not prefill.engine._held  # every hand-off released its blocks
        ttft[bw] = summarize("pd", result, 2.0, 0.05).ttft_p50_s
    # 4,000 tokens x 128 KiB at 1 GB/s is 0.52 s more before decode starts than at 1 TB/s.
    expected = 4000 * KV_BYTES_PER_TOKEN * (1 / 1e9 - 1 / 1e12)
    assert ttft[1e9] - ttft[1e12] == pytest.approx(expected, rel=0.02)


def test_short_or_cached_prompts_stay_on_decode():
    short = [TraceRequest(i * 1.0, 200, 4) for i in range(5)]  # under the 512-token threshold
    _, result = replay(pd_pool(), short)
    assert result.num_prefill_legs == 0 and len(result.finished) == 5
    # The same long prompt twice: the second time its decode replica holds the prefix
    # (installed from the hand-off), so the uncached part is under the threshold.
    same = TraceRequest(0.0, 3000, 4, hash_ids=(1, 2, 3, 4, 5, 6))
    again = TraceRequest(5.0, 3000, 4, hash_ids=(1, 2, 3, 4, 5, 6))
    _, result = replay(pd_pool(policy="prefix-cache"), [same, again])
    assert result.num_prefill_legs == 1 and len(result.finished) == 2
    assert result.finished[0].replica == result.finished[1].replica


def test_prefill_and_decode_scale_separately():
    # A burst of long prompts with short outputs loads prefill, not decode.
    trace = [TraceRequest(i / 8, 6000, 4) for i in range(8 * 40)]
    pool = pd_pool(prefill=(1, 4), decode=(2, 4))
    _, result = replay(pool, trace, scaler="kvfleet")
    assert len(result.finished) == len(trace)
    peak = {role: max(c[role] for _, c in result.role_timeline) for role in ("prefill", "decode")}
    assert peak["prefill"] >= 3 and peak["decode"] == 2, result.reasons
    assert any("scale prefill" in r for _, r in result.reasons)
    s = summarize("pd", result, 2.0, 0.05)
    assert set(s.replica_seconds_by_role) == {"prefill", "decode"}
    assert sum(s.replica_seconds_by_role.values()) == pytest.approx(s.replica_seconds)


def test_hand_off_model_and_bad_settings():
    assert Handoff(100, 1e9, 0.001).seconds(10_000) == pytest.approx(0.001 + 1e-3)
    with pytest.raises(ValueError):
        Handoff(100, 0.0)
    with pytest.raises(SimError):
        SimSettings(kv_bytes_per_s=0)


def test_prefill_legs_teach_the_prefill_roles_perf_model():
    """The prefill role's perf model (what the autoscaler sizes that role with) learns from
    its legs' latencies; without that it stays on its seed and the role sits at its max."""
    trace = [TraceRequest(i * 2.0, 2000 + 500 * (i % 4), 8) for i in range(12)]
    sim, result = replay(pd_pool(), trace)
    assert result.num_prefill_legs == len(trace)
    prefill = next(e for e in sim.router.core.registry.endpoints if e.name == "prefill-0")
    assert prefill.perf.ttft.num_samples == len(trace)
    assert prefill.perf.tpot.num_samples == 0  # it decodes nothing
    # what it learned is the prefill time: ~2,000-3,500 tokens on an idle H100
    predicted = prefill.perf.ttft.predict(ttft_features(2750, 0, 0, 0.0))
    assert predicted is not None and 0.05 < predicted < 1.0
