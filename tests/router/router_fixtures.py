"""Fixtures for router tests: fake backends and routers as real processes on 127.0.0.1."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/helpers

from helpers.procs import ProcessGroup, ServerProcess, kvfleet_argv  # noqa: E402

# kvfleet_bench's fake OpenAI backend, set up as these tests read it: any model served,
# 4 tokens of "<name>:<i> " 2 ms apart (finish_reason on the last), 4-char blocks, a request log
FAKE = [sys.executable, "-m", "kvfleet_bench.fake_backend", "--model", "fake", "--any-model",
        "--num-tokens", "4", "--token-delay-ms", "2", "--token-text", "{name}:{i} ",
        "--finish-on-last-token", "--block-chars", "4", "--log-requests"]
ADMIN_TOKEN = "test-admin-token"


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[ProcessGroup]:
    with ProcessGroup(tmp_path / "logs") as group:
        yield group


def start_fake(procs: ProcessGroup, name: str, *extra: str) -> ServerProcess:
    return procs.start([*FAKE, "--port", "{port}", "--name", name, *extra], timeout_s=30)


def write_config(path: Path, cfg: dict[str, Any]) -> Path:
    path.write_text(json.dumps(cfg))
    return path


def start_router(procs: ProcessGroup, tmp_path: Path, cfg: dict[str, Any],
                 env: dict[str, str] | None = None) -> ServerProcess:
    cfg_path = write_config(tmp_path / f"router-{len(procs.processes)}.json", cfg)
    token = tmp_path / "admin-token"
    token.write_text(ADMIN_TOKEN + "\n")
    return procs.start(kvfleet_argv("router", "--config", str(cfg_path), "--host", "127.0.0.1",
                                    "--port", "{port}", "--admin-token-file", str(token)),
                       timeout_s=30, env=env)


def endpoints_cfg(backends: list[ServerProcess], **extra: Any) -> list[dict[str, Any]]:
    return [{"name": f"b{i}", "url": b.url, **extra} for i, b in enumerate(backends)]


def http_json(url: str, body: Any = None, method: str | None = None,
              headers: dict[str, str] | None = None, timeout_s: float = 10) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def admin_headers() -> dict[str, str]:
    return {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def sse_post(url: str, path: str, body: dict[str, Any], on_event: Any = None,
             timeout_s: float = 300) -> list[Any]:
    """POST a streamed request; its data payloads (JSON, or "[DONE]"), `on_event(n)` called
    after the n-th, so a test can break things mid-stream."""
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    out: list[Any] = []
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: "):
                payload = line[len("data: "):]
                out.append(payload if payload == "[DONE]" else json.loads(payload))
                if on_event is not None:
                    on_event(len(out))
    return out


def sse_text(events: list[Any], is_chat: bool) -> str:
    """The answer's text, from chat deltas or completion chunks."""
    return "".join(((e["choices"][0]["delta"].get("content") or "") if is_chat
                    else e["choices"][0]["text"])
                   for e in events if e != "[DONE]" and e.get("choices"))


def in_process_backend(completions: Any) -> Any:
    """An aiohttp app standing for an idle engine: `completions` answers
    /v1/completions; /health is ok and /metrics says nothing is running or waiting."""
    from aiohttp import web

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text="vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
                                 "vllm:kv_cache_usage_perc 0\n")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    return app
