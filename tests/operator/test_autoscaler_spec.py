"""autoscaler_spec: InferencePool autoscaling fields -> AutoscalerConfig."""

from pathlib import Path

import pytest
from kvfleet_operator.api import load_pool
from kvfleet_operator.decide.autoscaler_spec import PREFILL_TOKENS_PER_S_DEFAULT, config_from_pool

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_local_sim_example():
    c = config_from_pool(load_pool(EXAMPLES / "local-sim.yaml").spec)
    assert list(c.roles) == ["unified"]
    assert (c.roles["unified"].min_replicas, c.roles["unified"].max_replicas) == (1, 6)
    t = c.targets["unified"]
    assert (t.num_waiting, t.kv_usage, t.ttft_p90_s) == (4, 0.75, 1.0)
    assert t.prefill_utilization is not None  # unified replicas prefill too
    assert (c.stable_window_s, c.panic_window_s, c.panic_threshold) == (10, 3, 2.0)
    assert (c.max_step_up, c.scale_up_cooldown_s) == (2, 2)
    assert (c.scale_down_window_s, c.scale_down_cooldown_s) == (20, 5)


@pytest.mark.parametrize("path", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_every_example_builds_a_config(path):
    spec = load_pool(EXAMPLES / path).spec
    c = config_from_pool(spec)
    assert set(c.roles) == set(spec.topology.roles())
    if "prefill" in c.roles:
        assert c.targets["prefill"].prefill_utilization is not None
        assert c.targets["prefill"].kv_usage is None
        assert c.targets["decode"].prefill_utilization is None
        assert c.targets["decode"].ttft_p90_s is None
    expected = spec.autoscaling.targets.prefill_tokens_per_second_per_replica
    assert c.prefill_tokens_per_s_initial == (expected or PREFILL_TOKENS_PER_S_DEFAULT)
