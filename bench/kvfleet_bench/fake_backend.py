"""A fake OpenAI server: the backend the router benchmarks measure against and the router
tests run in front of (one process can serve several backends, one per --port).

It answers /v1/completions and /v1/chat/completions (SSE streaming or not), /v1/models,
/health, /tokenize and /metrics (vLLM metric names from the engine contract), plus the
/server_info and /model_info stubs that sglang-router probes when a worker registers.

Timing: a request waits `--ttft-ms` plus `--prefill-ms-per-block` per uncached block, then
each token costs `--token-delay-ms` (one SSE write per token); with no token delay the whole
stream goes out in one write. Token i reads `--token-text` with {name} and {i} filled in
(" tok" by default; "{name}:{i} " tells a test who served which token).

Benchmark knobs travel only through standard OpenAI fields (`max_tokens`), because
sglang-router drops unknown fields and headers; everything else is a backend flag.
With `--cache-blocks N` each backend keeps an LRU-bounded prefix cache and reports, per
request, its hits in `usage.prompt_tokens_details.cached_tokens` (in characters, the
fake's "tokens") and its own name in `system_fingerprint`. GET /bench/stats returns its
counters and in-flight timeline; POST /bench/reset clears them between runs.

For tests, a control plane (plain JSON): POST /_fake/control with any of {"status": 500,
"num_bad": 2, "error_code": "caused_by_request"} (the next num_bad requests fail so),
{"running": 3, "waiting": 1, "kv": 0.4} (reported in /metrics instead of the real
counts), {"legacy": true} (KV usage under vLLM's old name), {"healthy": false} (/health
answers 503), {"stall_after_chunks": 2} (a stream hangs after two tokens); POST
/_fake/kv_events [KVEvent dicts] publishes to GET /v1/kv_events readers; with
--log-requests, GET /_fake/log returns every request seen (path, body, headers, the bytes
sent back in hex). A request with kv_transfer_params.do_remote_decode (a P/D prefill)
is answered with kv_transfer_params naming a handle "<name>-h<n>".

    python -m kvfleet_bench.fake_backend --port 8001 --port 8002 --num-tokens 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from kvfleet_engine import contract

from kvfleet_bench.prefix_cache import LRUPrefixCache

MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_TIMELINE = 500_000
LEGACY_KV_CACHE_USAGE = "vllm:gpu_cache_usage_perc"


def response_id(backend: str, arrival: int, is_chat: bool) -> str:
    """A response's id: it names the backend and numbers the request in the order it
    arrived there (counted from the last reset, just before the cache lookup), so a replay
    can put each backend's requests back in that order (`arrival_number`)."""
    return f"{'chatcmpl' if is_chat else 'cmpl'}-{backend}-{arrival}"


def arrival_number(rid: Any, backend: str) -> int | None:
    """The arrival number in an id `response_id` made for `backend`; None for any other
    id (a router that rewrote it)."""
    for kind in ("cmpl", "chatcmpl"):
        prefix = f"{kind}-{backend}-"
        if isinstance(rid, str) and rid.startswith(prefix) and rid[len(prefix):].isdigit():
            return int(rid[len(prefix):])
    return None


@dataclass(slots=True)
class FakeBackendConfig:
    name: str = "b0"
    model: str = "fake-model"
    is_any_model: bool = False  # serve whatever model a request names (and echo it)
    num_tokens: int = 8  # output tokens when a request gives no max_tokens
    max_num_tokens: int = 4096
    ttft_s: float = 0.0
    prefill_s_per_block: float = 0.0  # extra time to first token per uncached block
    token_delay_s: float = 0.0  # before each token
    num_cache_blocks: int = 0  # 0: no prefix cache
    block_chars: int = 512
    token_text: str = " tok"  # {name} and {i} filled in
    is_finish_on_last_token: bool = False  # vLLM's way; else a separate finish chunk
    is_logging_requests: bool = False

    def __post_init__(self) -> None:
        if not self.name or not self.model:
            raise ValueError("name and model must be non-empty")
        if self.num_tokens < 1 or self.max_num_tokens < self.num_tokens:
            raise ValueError("need 1 <= num_tokens <= max_num_tokens")
        if min(self.ttft_s, self.prefill_s_per_block, self.token_delay_s) < 0:
            raise ValueError("delays must be >= 0")
        if self.num_cache_blocks < 0 or self.block_chars < 1:
            raise ValueError("num_cache_blocks must be >= 0 and block_chars >= 1")
        self.token_text.format(name=self.name, i=0)  # a bad template fails here, not later


class BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def error_response(message: str, status: int, param: str | None = None,
                   code: object = None) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param,
                      "code": status if code is None else code}}
    return web.json_response(body, status=status)


def prompt_text(body: dict[str, Any], is_chat: bool) -> str:
    """The text the prefix cache sees: the prompt, or the chat messages' contents joined."""
    if is_chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise BadRequest("'messages' must be a non-empty list", "messages")
        parts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, list):  # content parts
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            if not isinstance(content, str):
                raise BadRequest("each message needs string 'content'", "messages")
            parts.append(content)
        return "".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        return "".join(p if isinstance(p, str) else json.dumps(p) for p in prompt)
    raise BadRequest("'prompt' must be a string or a non-empty list", "prompt")


def requested_tokens(body: dict[str, Any], cfg: FakeBackendConfig) -> int:
    key = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    value = body.get(key)
    if value is None:
        return cfg.num_tokens
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise BadRequest(f"'{key}' must be a positive integer", key)
    return min(value, cfg.max_num_tokens)


def sse(event: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


@dataclass(slots=True)
class Reply:
    """What one generation request is answered with (its id, model, tokens, usage)."""

    rid: str
    model: str
    is_chat: bool
    num_tokens: int
    usage: dict[str, Any]
    entry: dict[str, Any] | None  # its /_fake/log entry, when requests are logged

    def record(self, data: bytes) -> None:
        if self.entry is not None:
            self.entry["sent"] += data.hex()


class FakeBackend:
    """One fake engine replica: its config, counters, prefix cache, in-flight timeline and
    test controls."""

    def __init__(self, cfg: FakeBackendConfig) -> None:
        self.cfg = cfg
        self.cache = (
            LRUPrefixCache(cfg.num_cache_blocks, cfg.block_chars) if cfg.num_cache_blocks else None
        )
        self.control: dict[str, Any] = {"healthy": True, "status": 200, "num_bad": 0,
                                        "legacy": False}
        self.log: list[dict[str, Any]] = []
        self.readers: list[asyncio.Queue[bytes]] = []
        self.num_handles = 0
        self.reset()

    def reset(self) -> None:
        self.num_requests = 0
        self.num_errors = 0
        self.num_prompt_blocks = 0
        self.num_hit_blocks = 0
        self.num_generation_tokens = 0
        self.num_in_flight = 0
        self.num_blocks_in_use = 0  # held by in-flight requests, as vLLM's KV usage counts
        self.num_tokenize = 0
        self.timeline: deque[tuple[float, int]] = deque(maxlen=MAX_TIMELINE)
        self.request_seq = 0
        if self.cache is not None:
            self.cache.clear()

    def _track(self, delta: int) -> None:
        self.num_in_flight += delta
        self.timeline.append((time.time(), self.num_in_flight))

    def token(self, i: int) -> str:
        return self.cfg.token_text.format(name=self.cfg.name, i=i)

    # --- OpenAI endpoints ---
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, is_chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._generate(request, is_chat=True)

    def _injected_error(self) -> web.Response | None:
        if self.control.get("num_bad", 0) <= 0:
            return None
        self.control["num_bad"] -= 1
        self.num_errors += 1
        return error_response("injected", int(self.control.get("status", 500)),
                              code=self.control.get("error_code", 500))

    async def _generate(self, request: web.Request, is_chat: bool) -> web.StreamResponse:
        cfg = self.cfg
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise BadRequest("the body must be a JSON object")
            entry = None
            if cfg.is_logging_requests:
                entry = {"path": request.path, "body": body, "headers": dict(request.headers),
                         "sent": ""}
                self.log.append(entry)
            if (injected := self._injected_error()) is not None:
                return injected
            model = body.get("model", cfg.model)
            if model != cfg.model and not cfg.is_any_model:
                raise BadRequest(f"The model `{model}` does not exist.", "model", 404)
            text = prompt_text(body, is_chat)
            num_tokens = requested_tokens(body, cfg)
            is_stream = bool(body.get("stream", False))
        except json.JSONDecodeError:
            self.num_errors += 1
            return error_response("the body is not valid JSON", 400)
        except BadRequest as exc:
            self.num_errors += 1
            return error_response(str(exc), exc.status, exc.param)

        self.num_requests += 1
        self.request_seq += 1
        num_prompt_blocks = num_hit_blocks = 0
        if self.cache is not None:
            lookup = self.cache.lookup_and_store(text)
            num_prompt_blocks, num_hit_blocks = lookup.num_prompt_blocks, lookup.num_hit_blocks
            self.num_prompt_blocks += num_prompt_blocks
            self.num_hit_blocks += num_hit_blocks
        usage = {
            "prompt_tokens": len(text),
            "completion_tokens": num_tokens,
            "total_tokens": len(text) + num_tokens,
            "prompt_tokens_details": {"cached_tokens": num_hit_blocks * cfg.block_chars},
        }
        rid = response_id(cfg.name, self.request_seq, is_chat)
        reply = Reply(rid, str(model), is_chat, num_tokens, usage, entry)
        prefill_s = cfg.ttft_s + cfg.prefill_s_per_block * (num_prompt_blocks - num_hit_blocks)
        self._track(+1)
        self.num_blocks_in_use += num_prompt_blocks
        try:
            if prefill_s > 0:
                await asyncio.sleep(prefill_s)
            if is_stream:
                include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
                return await self._stream(request, reply, include_usage)
            if cfg.token_delay_s > 0:
                await asyncio.sleep(cfg.token_delay_s * num_tokens)
            self.num_generation_tokens += num_tokens
            full = self._full_body(reply)
            params = body.get("kv_transfer_params") or {}
            if isinstance(params, dict) and params.get("do_remote_decode"):
                full["kv_transfer_params"] = self._prefill_handle()
            data = json.dumps(full).encode()
            reply.record(data)
            return web.Response(body=data, content_type="application/json")
        finally:
            self._track(-1)
            self.num_blocks_in_use -= num_prompt_blocks

    def _prefill_handle(self) -> dict[str, Any]:
        """What a P/D prefill answers: where the decode side fetches the KV blocks."""
        self.num_handles += 1
        return {"do_remote_prefill": True, "do_remote_decode": False,
                "remote_host": "127.0.0.1", "remote_port": 1,
                "remote_handle": f"{self.cfg.name}-h{self.num_handles}",
                "remote_block_ids": [1, 2]}

    def _full_body(self, reply: Reply) -> dict[str, Any]:
        text = "".join(self.token(i) for i in range(reply.num_tokens))
        if reply.is_chat:
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
        kind = "chat.completion" if reply.is_chat else "text_completion"
        return {**self._envelope(reply, kind, choice), "usage": reply.usage}

    def _envelope(self, reply: Reply, kind: str, choice: dict[str, Any]) -> dict[str, Any]:
        return {"id": reply.rid, "object": kind, "created": int(time.time()),
                "model": reply.model, "system_fingerprint": self.cfg.name, "choices": [choice]}

    def _chunk(self, reply: Reply, delta: str | None, finish: str | None) -> bytes:
        if reply.is_chat:
            body_delta = {} if delta is None else {"role": "assistant", "content": delta}
            choice: dict[str, Any] = {"index": 0, "delta": body_delta, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": delta or "", "logprobs": None, "finish_reason": finish}
        kind = "chat.completion.chunk" if reply.is_chat else "text_completion"
        return sse(self._envelope(reply, kind, choice))

    async def _stream(self, request: web.Request, reply: Reply,
                      include_usage: bool) -> web.StreamResponse:
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        n = reply.num_tokens
        is_finish_inline = self.cfg.is_finish_on_last_token
        tokens = [self._chunk(reply, self.token(i),
                              "length" if is_finish_inline and i == n - 1 else None)
                  for i in range(n)]
        tail = b"" if is_finish_inline else self._chunk(reply, None, "length")
        if include_usage:
            usage_chunk = {"id": reply.rid, "object": "chunk", "model": reply.model,
                           "choices": [], "usage": reply.usage}
            tail += b"data: " + json.dumps(usage_chunk).encode() + b"\n\n"
        tail += b"data: [DONE]\n\n"
        delay = self.cfg.token_delay_s
        stall_at = self.control.get("stall_after_chunks")
        if delay > 0 or stall_at is not None:  # one write per token, as an engine streams
            for i, token in enumerate(tokens):
                if i == stall_at:
                    await asyncio.sleep(3600)  # a hung backend: connection open, no bytes
                await asyncio.sleep(delay)
                reply.record(token)
                await response.write(token)
                self.num_generation_tokens += 1
            reply.record(tail)
            await response.write(tail)
        else:  # as fast as possible: the whole stream in one write
            self.num_generation_tokens += n
            data = b"".join(tokens) + tail
            reply.record(data)
            await response.write(data)
        await response.write_eof()
        return response

    async def models(self, request: web.Request) -> web.Response:
        card = {"id": self.cfg.model, "object": "model", "created": 0, "owned_by": "kvfleet-bench"}
        return web.json_response({"object": "list", "data": [card]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.control.get("healthy", True) else 503, text="")

    async def tokenize(self, request: web.Request) -> web.Response:
        """vLLM's /tokenize, for routers that tokenize prompts themselves (vllm-router's
        cache_aware). The fake's tokens are characters, as its cached_tokens are."""
        self.num_tokenize += 1
        try:
            body = await request.json()
            prompt = body.get("prompt")
            if prompt is None:
                prompt = "".join(str(m.get("content", "")) for m in body.get("messages", []))
            if not isinstance(prompt, str):
                raise ValueError("prompt must be a string")
        except (ValueError, AttributeError, TypeError):
            return error_response("bad tokenize request", 400, code=400)
        tokens = [ord(c) for c in prompt]
        return web.json_response({"count": len(tokens), "max_model_len": 1 << 20,
                                  "tokens": tokens, "token_strs": None})

    async def server_info(self, request: web.Request) -> web.Response:
        # No model path, so sglang-router has no tokenizer to fetch from a hub.
        return web.json_response({"served_model_name": self.cfg.model, "max_total_num_tokens": 0})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": None, "is_generation": True})

    async def metrics(self, request: web.Request) -> web.Response:
        label = f'{{{contract.MODEL_LABEL}="{self.cfg.model}"}}'
        c = self.control
        # vLLM counts blocks that running requests hold; cached free blocks are not "used"
        capacity = self.cfg.num_cache_blocks
        usage = min(1.0, self.num_blocks_in_use / capacity) if capacity else 0.0
        kv_name = LEGACY_KV_CACHE_USAGE if c.get("legacy") else contract.KV_CACHE_USAGE_PERC
        queries = self.num_prompt_blocks * self.cfg.block_chars
        hits = self.num_hit_blocks * self.cfg.block_chars
        lines = [
            f"{contract.NUM_REQUESTS_RUNNING}{label} {c.get('running', self.num_in_flight)}",
            f"{contract.NUM_REQUESTS_WAITING}{label} {c.get('waiting', 0)}",
            f"{kv_name}{label} {float(c.get('kv', usage)):.6f}",
            f"{contract.PREFIX_CACHE_QUERIES}_total{label} {queries}",
            f"{contract.PREFIX_CACHE_HITS}_total{label} {hits}",
            f"{contract.NUM_PREEMPTIONS}_total{label} 0",
            f"{contract.GENERATION_TOKENS}_total{label} {self.num_generation_tokens}",
            f'{contract.CACHE_CONFIG_INFO}{{block_size="{self.cfg.block_chars}",'
            f'num_gpu_blocks="{self.cfg.num_cache_blocks}"}} 1',
        ]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    # --- benchmark bookkeeping ---
    async def stats(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "name": self.cfg.name,
                "num_requests": self.num_requests,
                "num_errors": self.num_errors,
                "num_prompt_blocks": self.num_prompt_blocks,
                "num_hit_blocks": self.num_hit_blocks,
                "num_cached_blocks": len(self.cache) if self.cache is not None else 0,
                "num_in_flight": self.num_in_flight,
                "num_tokenize": self.num_tokenize,
                "timeline": list(self.timeline) if request.query.get("timeline") else [],
            }
        )

    async def reset_stats(self, request: web.Request) -> web.Response:
        self.reset()
        return web.json_response({"reset": self.cfg.name})

    # --- test controls ---
    async def set_control(self, request: web.Request) -> web.Response:
        self.control.update(await request.json())
        return web.json_response(self.control)

    async def get_log(self, request: web.Request) -> web.Response:
        return web.json_response({"name": self.cfg.name, "log": self.log,
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


ROUTES = [  # (method, path, FakeBackend handler)
    ("POST", "/v1/completions", "completions"),
    ("POST", "/v1/chat/completions", "chat_completions"),
    ("GET", "/v1/models", "models"),
    ("GET", "/health", "health"),
    ("POST", "/tokenize", "tokenize"),
    ("GET", "/metrics", "metrics"),
    *(("GET", path, "server_info") for path in ("/server_info", "/get_server_info")),
    *(("GET", path, "model_info") for path in ("/model_info", "/get_model_info")),
    ("GET", "/bench/stats", "stats"),
    ("POST", "/bench/reset", "reset_stats"),
    ("GET", "/v1/kv_events", "kv_events"),
    ("POST", "/_fake/control", "set_control"),
    ("POST", "/_fake/kv_events", "push_events"),
    ("GET", "/_fake/log", "get_log"),
]


def build_app(backend: FakeBackend) -> web.Application:
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    for method, path, handler in ROUTES:
        app.router.add_route(method, path, getattr(backend, handler))
    return app


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, action="append", required=True,
                   help="one backend per --port, named b0, b1, ... in order")
    p.add_argument("--name", action="append", default=None,
                   help="the backends' names, one per --port (default b0, b1, ...)")
    p.add_argument("--model", default="fake-model")
    p.add_argument("--any-model", action="store_true",
                   help="serve any model a request names (else 404), and echo it")
    p.add_argument("--num-tokens", type=int, default=8)
    p.add_argument("--max-num-tokens", type=int, default=4096)
    p.add_argument("--ttft-ms", type=float, default=0.0)
    p.add_argument("--prefill-ms-per-block", type=float, default=0.0)
    p.add_argument("--token-delay-ms", type=float, default=0.0)
    p.add_argument("--cache-blocks", type=int, default=0, help="LRU bound per backend; 0 = off")
    p.add_argument("--block-chars", type=int, default=512)
    p.add_argument("--token-text", default=" tok",
                   help='token i\'s text; {name} and {i} are filled in (e.g. "{name}:{i} ")')
    p.add_argument("--finish-on-last-token", action="store_true",
                   help="finish_reason rides on the last token's chunk (vLLM's way), "
                        "not on a chunk of its own")
    p.add_argument("--log-requests", action="store_true",
                   help="keep every request (and the bytes sent back) for GET /_fake/log")
    args = p.parse_args(argv)
    if args.name is not None and len(args.name) != len(args.port):
        p.error("give one --name per --port, or none")
    return args


async def serve(args: argparse.Namespace) -> None:
    runners = []
    for i, port in enumerate(args.port):
        cfg = FakeBackendConfig(
            name=args.name[i] if args.name else f"b{i}",
            model=args.model,
            is_any_model=args.any_model,
            num_tokens=args.num_tokens,
            max_num_tokens=args.max_num_tokens,
            ttft_s=args.ttft_ms / 1000,
            prefill_s_per_block=args.prefill_ms_per_block / 1000,
            token_delay_s=args.token_delay_ms / 1000,
            num_cache_blocks=args.cache_blocks,
            block_chars=args.block_chars,
            token_text=args.token_text,
            is_finish_on_last_token=args.finish_on_last_token,
            is_logging_requests=args.log_requests,
        )
        runner = web.AppRunner(build_app(FakeBackend(cfg)), access_log=None)
        await runner.setup()
        await web.TCPSite(runner, args.host, port, backlog=4096).start()
        runners.append(runner)
    print(f"fake backends ready on {args.host}:{','.join(map(str, args.port))}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        for runner in runners:
            await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    try:
        asyncio.run(serve(args))
    except ValueError as exc:
        print(f"fake_backend: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"fake_backend: cannot listen: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
