"""A killed operator, with real processes (issue 31, item 3): kvfleet's kopf operator
(in-process, against kmock) is killed while a scale-down drains a busy engine; the router and
engine processes (`process_kubelet`) serve on while it is gone; a new operator reads the
pool back and carries on: no duplicate pod, the drain ends at the drain's own deadline (not
one restarted with the operator), and the router's config version never goes backwards."""

from __future__ import annotations

import asyncio
import base64
import copy
import json
import threading
import time

import aiohttp
import openai
import pytest
from kmock_shim import Operator, api, eventually
from kvfleet_operator.runtimes.kubernetes.operator_config import OperatorConfig
from kvfleet_operator.runtimes.kubernetes.ports.status_store import LOOP_STATE_ANNOTATION
from process_kubelet import ProcessKubelet
from test_k8s_loop_processes import DEPLOYMENT, MODEL, NAME, NS, POOL, ready

DRAIN_TIMEOUT_S = 12.0
DEAD_S = 8.0  # how long no operator runs, from the drain's start
POOLS = f"/apis/kvfleet.io/v1alpha1/namespaces/{NS}/inferencepools"


def loop_state(cluster) -> dict:
    body = cluster.obj("kvfleet.io/v1alpha1/inferencepools", NS, NAME) or {}
    raw = (body.get("metadata", {}).get("annotations") or {}).get(LOOP_STATE_ANNOTATION)
    return json.loads(raw) if raw else {}


async def router_version(base: str, token: str) -> int:
    async with aiohttp.ClientSession() as http, http.get(
            f"{base}/admin/config", headers={"Authorization": f"Bearer {token}"}) as resp:
        return int((await resp.json())["version"])


def stream(base: str) -> None:
    """One long stream, in a thread: tasks the test creates would be cancelled with the
    in-process operator (kopf cancels the tasks started after it when it exits)."""
    client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=90)
    try:
        for _ in client.completions.create(model=MODEL, prompt="tell me everything",
                                           max_tokens=4000, stream=True,
                                           extra_body={"ignore_eos": True}):  # fmt: skip
            pass
    except openai.OpenAIError:
        pass  # the victim is stopped at its drain timeout: its stream may be cut
    finally:
        client.close()


@pytest.mark.timeout(180)
async def test_a_killed_operator_leaves_serving_and_its_successor_keeps_the_drain(
        cluster, tmp_path):  # fmt: skip
    pool = copy.deepcopy(POOL)
    pool["spec"]["topology"]["unified"]["replicas"] = {"min": 2, "max": 2}
    pool["spec"]["autoscaling"]["drainTimeoutSeconds"] = int(DRAIN_TIMEOUT_S)
    config = OperatorConfig(max_tick_s=0.5, retry_delay_s=0.5)
    async with ProcessKubelet(cluster, NS, tmp_path) as kubelet:
        first = await Operator(str(cluster.url), config).start()
        second: Operator | None = None
        try:
            await api(cluster, "POST", POOLS, pool)

            def engines() -> dict[str, str]:
                return {p.name: p.ip for p in kubelet.pods.values() if p.deployment == DEPLOYMENT}

            await eventually(lambda: ready(cluster) and len([
                p for p in kubelet.pods.values() if p.deployment == DEPLOYMENT and p.is_ready
            ]) == 2, 90, "two engines Ready")  # fmt: skip
            pods = engines()
            router = next(p for p in kubelet.pods.values() if p.deployment == f"{NAME}-router")
            base = f"http://{router.ip}:8000"
            secret = cluster.obj("v1/secrets", NS, f"{NAME}-router-admin-token")
            token = base64.b64decode(secret["data"]["token"]).decode()
            streams = [threading.Thread(target=stream, args=(base,), daemon=True)
                       for _ in range(2)]  # fmt: skip
            for thread in streams:
                thread.start()
            await asyncio.sleep(2.0)  # one stream on each engine (least-request)

            await api(cluster, "PATCH", f"{POOLS}/{NAME}",
                      {"spec": {"topology": {"unified": {"replicas": {"min": 1, "max": 1}}}}},
                      "application/merge-patch+json")  # fmt: skip
            state = await eventually(lambda: loop_state(cluster).get("drain_started") and
                                     loop_state(cluster), 30, "a drain under way")  # fmt: skip
            ((victim, started),) = state["drain_started"].items()
            version = await router_version(base, token)
            await asyncio.sleep(1.0)
            await first.kill()  # mid-drain
            killed_at = time.time()
            assert victim in engines() and killed_at - started < DRAIN_TIMEOUT_S - 4

            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused",
                                        max_retries=0, timeout=30)  # fmt: skip
            reply = await client.completions.create(model=MODEL, prompt="anyone?", max_tokens=4)
            await client.close()
            assert reply.choices[0].finish_reason in ("stop", "length")  # serving goes on
            await asyncio.sleep(max(0.0, started + DEAD_S - time.time()))

            second = await Operator(str(cluster.url), config).start()
            await eventually(lambda: victim not in engines(), 30, f"{victim} removed")
            stopped_after = time.time() - started
            # The drain's own deadline, plus ticks and the kubelet's pass; a timer restarted
            # with the second operator would run to DEAD_S + DRAIN_TIMEOUT_S at least.
            assert stopped_after < DRAIN_TIMEOUT_S + 4.0, stopped_after
            assert set(engines()) == set(pods) - {victim}  # no pod added, the survivor kept
            assert [p.ip for p in kubelet.pods.values()
                    if p.deployment == f"{NAME}-router"] == [router.ip]  # fmt: skip
            assert await router_version(base, token) >= version
            reasons = [json.loads(r.body)["reason"] for r in cluster.sent("POST", "/events")]
            assert "DrainTimedOut" in reasons, reasons
        finally:
            await first.kill()
            if second is not None:
                await second.stop()
