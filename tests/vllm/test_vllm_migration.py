"""Request migration in front of a real vLLM: a greedy stream whose replica dies mid-answer
arrives whole and token-exact against an uninterrupted run, for completions and for chat.

The tier runs one vLLM (a CPU machine holds one comfortably), so the replica that dies is
a relay process standing in front of it: the router's endpoint `dying` is the relay,
`vllm` is the server itself. SIGKILL of the relay resets the router's connection exactly
as a killed engine's does, and the continuation then runs on vLLM through the other
endpoint. What this checks is vLLM's side of the contract: `return_token_ids` (vLLM >=
0.10.2) in its streams, and a completion over the prompt's ids plus the generated ids
continuing the answer token for token (chat included: its first chunk's
`prompt_token_ids` are the templated prompt).

The server runs `--dtype float32`. In bfloat16 (vLLM's `auto` for this model on CPU) a
recomputed prefix and a decoded one differ in their last bits, so a greedy near-tie may
flip some tokens after the seam: measured here, a chat answer continued exactly for
about 50 tokens past the seam and then took the other branch of a near-tie. That is
vLLM's numerics (any recompute-based migration meets it, as a preemption by recompute
does), not the splice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers, tests/router
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from helpers.procs import ProcessGroup, free_port, wait_healthy  # noqa: E402
from router_fixtures import ADMIN_TOKEN, sse_post, sse_text, start_router  # noqa: E402
from vllm_helpers import LOG, running_vllm  # noqa: E402

RELAY = r"""
import asyncio, sys
upstream, port = int(sys.argv[1]), int(sys.argv[2])
async def pipe(r, w):
    try:
        while data := await r.read(65536):
            w.write(data); await w.drain()
    finally:
        w.close()
async def handle(cr, cw):
    ur, uw = await asyncio.open_connection("127.0.0.1", upstream)
    await asyncio.gather(pipe(cr, uw), pipe(ur, cw), return_exceptions=True)
async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", port)
    await server.serve_forever()
asyncio.run(main())
"""


@pytest.fixture(scope="module")
def vllm_server():
    with running_vllm(("--dtype", "float32"), LOG.with_name("test-vllm-migration.log")) \
            as server:
        yield server


@pytest.mark.parametrize("is_chat", [False, True], ids=["completions", "chat"])
def test_a_dying_replicas_vllm_stream_continues_token_exact(vllm_server, tmp_path, is_chat):
    with ProcessGroup(tmp_path / "logs") as procs:
        relay_port = free_port()
        relay = subprocess.Popen([sys.executable, "-c", RELAY, str(vllm_server.port),
                                  str(relay_port)], start_new_session=True)
        try:
            deadline = time.monotonic() + 10
            while subprocess.run(["bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{relay_port}"],
                                 capture_output=True).returncode != 0:
                assert time.monotonic() < deadline, "the relay never listened"
                time.sleep(0.1)
            router = start_router(procs, tmp_path, {
                "endpoints": [
                    {"name": "dying", "url": f"http://127.0.0.1:{relay_port}", "engine": "vllm"},
                    {"name": "vllm", "url": vllm_server.url, "engine": "vllm",
                     "state": "draining"}],  # new requests to `dying` only, at first
                "policy": {"name": "least-request"}})
            wait_healthy(router, timeout_s=30)
            prompt = ({"messages": [{"role": "user", "content": "Write a long story about a "
                                     "lighthouse keeper."}]} if is_chat
                      else {"prompt": "Once upon a time, in a lighthouse by the sea,"})
            body = {"model": vllm_server.model, **prompt, "max_tokens": 96, "temperature": 0,
                    "ignore_eos": True, "stream": True,
                    "stream_options": {"include_usage": True}}
            path = "/v1/chat/completions" if is_chat else "/v1/completions"
            reference = sse_post(vllm_server.url, path, body)  # uninterrupted, straight to vLLM
            # Once the stream is under way: `vllm` takes requests, and the relay dies.

            def kill_relay(i: int) -> None:
                if i == 12:
                    _activate(router, vllm_server, relay_port)
                    os.kill(relay.pid, signal.SIGKILL)

            migrated = sse_post(router.url, path, body, kill_relay)
        finally:
            relay.kill()
            relay.wait()
    assert relay.returncode == -signal.SIGKILL
    assert migrated[-1] == "[DONE]" and migrated.count("[DONE]") == 1
    assert not any(e != "[DONE]" and "error" in e for e in migrated)
    assert sse_text(migrated, is_chat) == sse_text(reference, is_chat)
    usage = migrated[-2]["usage"]
    assert usage["completion_tokens"] == 96
    assert usage["prompt_tokens"] == reference[-2]["usage"]["prompt_tokens"]
    if is_chat:
        assert sum(1 for e in migrated if e != "[DONE]" and e.get("choices")
                   and "role" in e["choices"][0]["delta"]) == 1


def _activate(router: Any, vllm_server: Any, relay_port: int) -> None:
    """Push a config where `vllm` takes new requests (the continuation among them)."""
    cfg = {"version": int(time.time()), "policy": {"name": "least-request"}, "endpoints": [
        {"name": "dying", "url": f"http://127.0.0.1:{relay_port}", "engine": "vllm"},
        {"name": "vllm", "url": vllm_server.url, "engine": "vllm"}]}
    req = urllib.request.Request(router.url + "/admin/config", data=json.dumps(cfg).encode(),
                                 method="PUT", headers={"Content-Type": "application/json",
                                                        "Authorization": f"Bearer {ADMIN_TOKEN}"})
    urllib.request.urlopen(req, timeout=10).read()
