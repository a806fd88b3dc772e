"""A small fake OpenAI server for router tests, run as a real subprocess.

    python fake_backend.py --port N --name b0 [--role prefill] [--token-delay-ms 5]

Answers /v1/completions and /v1/chat/completions (streaming or not) with text that names
the backend, so a test can tell who served. `max_tokens` sets the number of stream chunks.
Control plane for tests (plain JSON): POST /_fake/control {"status": 500, "num_bad": 2,
"error_code": "caused_by_request" (the injected error's code),
"running": 3, "waiting": 1, "kv": 0.4, "legacy": true, "healthy": false,
"stall_after_chunks": 2}; POST
/_fake/kv_events [KVEvent dicts] publishes to GET /v1/kv_events readers; GET /_fake/log
returns every request seen (path, body, headers, bytes sent back in hex).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

from aiohttp import web


class Fake:
    def __init__(self, name: str, role: str, token_delay_s: float) -> None:
        self.name, self.role, self.token_delay_s = name, role, token_delay_s
        self.control: dict[str, Any] = {"running": 0, "waiting": 0, "kv": 0.0, "legacy": False,
                                        "healthy": True, "status": 200, "num_bad": 0}
        self.log: list[dict[str, Any]] = []
        self.readers: list[asyncio.Queue[bytes]] = []
        self.num_in_flight = 0
        self.num_handles = 0

    def body_for(self, req: dict[str, Any], i: int) -> dict[str, Any]:
        return {"id": f"cmpl-{self.name}-{i}", "object": "text_completion", "created": 1,
                "model": req.get("model", "fake"),
                "choices": [{"index": 0, "text": f"{self.name}:{i} ", "finish_reason": None}]}

    async def generate(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        req = json.loads(raw)
        entry: dict[str, Any] = {"path": request.path, "body": req,
                                 "headers": dict(request.headers), "sent": ""}
        self.log.append(entry)
        if self.control["num_bad"] > 0:
            self.control["num_bad"] -= 1
            return web.json_response({"error": {"message": "injected", "type": "server_error",
                                                "param": None,
                                                "code": self.control.get("error_code", 500)}},
                                     status=self.control["status"])
        n = int(req.get("max_tokens", 4))
        params = req.get("kv_transfer_params") or {}
        if params.get("do_remote_decode"):
            self.num_handles += 1
            body = self.body_for(req, 0)
            body["kv_transfer_params"] = {"do_remote_prefill": True, "do_remote_decode": False,
                                          "remote_host": "127.0.0.1", "remote_port": 1,
                                          "remote_handle": f"{self.name}-h{self.num_handles}",
                                          "remote_block_ids": [1, 2]}
            data = json.dumps(body).encode()
            entry["sent"] = data.hex()
            return web.Response(body=data, content_type="application/json")
        self.num_in_flight += 1
        try:
            if not req.get("stream"):
                await asyncio.sleep(self.token_delay_s * n)
                body = self.body_for(req, 0)
                body["choices"][0]["text"] = "".join(f"{self.name}:{i} " for i in range(n))
                body["usage"] = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": 3 + n}
                data = json.dumps(body).encode()
                entry["sent"] = data.hex()
                return web.Response(body=data, content_type="application/json")
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            sent = bytearray()
            for i in range(n):
                if i == self.control.get("stall_after_chunks"):
                    await asyncio.sleep(3600)  # a hung backend: connection open, no bytes
                await asyncio.sleep(self.token_delay_s)
                chunk = b"data: " + json.dumps(self.body_for(req, i)).encode() + b"\n\n"
                sent += chunk
                entry["sent"] = bytes(sent).hex()
                await resp.write(chunk)
            sent += b"data: [DONE]\n\n"
            entry["sent"] = bytes(sent).hex()
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        finally:
            self.num_in_flight -= 1

    async def metrics(self, request: web.Request) -> web.Response:
        c = self.control
        kv_name = "vllm:gpu_cache_usage_perc" if c["legacy"] else "vllm:kv_cache_usage_perc"
        text = (
            "# TYPE vllm:num_requests_running gauge\n"
            f'vllm:num_requests_running{{model_name="fake"}} {c["running"]}\n'
            f'vllm:num_requests_waiting{{model_name="fake"}} {c["waiting"]}\n'
            f'{kv_name}{{model_name="fake"}} {c["kv"]}\n'
            'vllm:cache_config_info{block_size="4",num_gpu_blocks="100"} 1.0\n')
        return web.Response(text=text, content_type="text/plain")

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.control["healthy"] else 503, text="")

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "object": "model"}]})

    async def set_control(self, request: web.Request) -> web.Response:
        self.control.update(await request.json())
        return web.json_response(self.control)

    async def get_log(self, request: web.Request) -> web.Response:
        return web.json_response({"name": self.name, "log": self.log,
                                  "num_in_flight": self.num_in_flight})

    async def push_events(self, request: web.Request) -> web.Response:
        lines = b"".join(json.dumps(e).encode() + b"\n" for e in await request.json())
        for q in self.readers:
            q.put_nowait(lines)
        return web.json_response({"num_readers": len(self.readers)})

    async def kv_events(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
        await resp.prepare(request)
        q: asyncio.Queue[bytes] = asyncio.Queue()
        self.readers.append(q)
        try:
            while True:
                await resp.write(await q.get())
        finally:
            self.readers.remove(q)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--name", default="fake")
    p.add_argument("--role", default="unified")
    p.add_argument("--token-delay-ms", type=float, default=2.0)
    args = p.parse_args()
    fake = Fake(args.name, args.role, args.token_delay_ms / 1000)
    app = web.Application()
    app.router.add_post("/v1/completions", fake.generate)
    app.router.add_post("/v1/chat/completions", fake.generate)
    app.router.add_get("/v1/models", fake.models)
    app.router.add_get("/metrics", fake.metrics)
    app.router.add_get("/health", fake.health)
    app.router.add_get("/v1/kv_events", fake.kv_events)
    app.router.add_post("/_fake/control", fake.set_control)
    app.router.add_post("/_fake/kv_events", fake.push_events)
    app.router.add_get("/_fake/log", fake.get_log)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None, access_log=None,
                backlog=4096)


if __name__ == "__main__":
    main()
