"""A bounded chaos run: engines SIGKILLed and hung (SIGSTOP past the router's idle timeout)
under streamed load lose no request, because the router retries before the first byte and
migrates a broken stream after it (router config `migration`). The soak's own machinery
(bench/kvfleet_bench/chaos) runs it: a `kvfleet up` fleet of three simulated engines and a
second router replica whose config mirrors the fleet's, with short timeouts so a hang fits
in the test. It fails with router migration off (`migration.enabled: false`: the broken
streams end in an error event).

A control loop killed mid-drain keeps the drain's deadline (no restarted drain timer):
tests/e2e_local/test_up_restart.py::test_a_drain_deadline_survives_a_killed_up, with real
processes, and tests/kubernetes for the operator."""

import asyncio

import pytest
from kvfleet_bench.chaos import schedule as sch
from kvfleet_bench.chaos.soak import SoakConfig, run_soak

pytestmark = pytest.mark.slow

POOL = sch.__file__.rsplit("/", 1)[0] + "/pool.yaml"
# Router replica B: a hang is noticed after 3 s of silence (the default is a minute).
FAST_TIMEOUTS = {"timeouts": {"idle_s": 3.0, "first_byte_s": 5.0}}
FAULTS = [
    sch.Fault(at_s=4.0, kind=sch.ENGINE_KILL, target=1, duration_s=0.0),
    sch.Fault(at_s=9.0, kind=sch.ENGINE_HANG, target=2, duration_s=5.0),
    sch.Fault(at_s=18.0, kind=sch.ENGINE_KILL, target=0, duration_s=0.0),
    sch.Fault(at_s=23.0, kind=sch.ENGINE_HANG, target=1, duration_s=5.0),
]


def soak_config(tmp_path, overrides):
    return SoakConfig(
        pool=POOL, work_dir=tmp_path / "chaos", seed=0, duration_s=32.0, num_faults=len(FAULTS),
        rate=4.0, faults=FAULTS, max_tokens=(150, 250), load_routers="b",
        shapes=("completion_stream", "chat_stream"), router_b_overrides=overrides,
        recovery_limit_s=30.0, say=print)


def test_engine_kills_and_hangs_under_streamed_load_lose_no_request(tmp_path):
    result = asyncio.run(run_soak(soak_config(tmp_path, FAST_TIMEOUTS)))
    s = result["summary"]
    print(f"\nchaos: {s['num_sent']} sent, {s['num_failed']} failed {s['failed_by_cause']}, "
          f"migrations {s['migrations']}, recovery {s['recovery_s']}")
    assert s["num_sent"] >= 100
    assert s["num_not_recovered"] == 0, result["faults"]
    # The kills and hangs broke streams mid-way (so the run tested something): they were
    # continued, not lost. With migration off this is 0 and some streams fail.
    assert s["migrations"].get("continued", 0) >= 1, s["migrations"]
    assert s["num_failed"] == 0, result["failures"][:5]
    left = s["leftovers"]
    assert left["processes"] == [] and left["ports_bound"] == [] and left["state_is_stopped"]
    assert not any(left[f"router_{w}_config_mismatch"] for w in "ab"), left
