"""The hostile-request corpus: one data-driven place, run against an engine and a router.

Each `Case` is raw bytes sent over a socket (so protocol garbage is as easy as JSON), what
the client does next (`wait` for the answer, `stall` mid-body until the server gives up,
`abort`: hang up mid-body), where it applies, and the answer it must get: a status (an
exact one, or "4xx"), an OpenAI error body (`{"error": {"message", "type", ...}}`) unless
`shape` is False, and where it matters the error `code`. No case may ever get a 5xx.

`MAX_BODY`, `BODY_TIMEOUT_S` and `MAX_UPLOADS` are the limits the tests start both
servers with; `ADMIN_TOKEN`/`ENGINE_TOKEN` are the tokens they hold.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

MAX_BODY = 65536
BODY_TIMEOUT_S = 1.0
MAX_UPLOADS = 4
ADMIN_TOKEN = "hostile-admin-token"
ENGINE_TOKEN = "hostile-engine-token"
MODEL = "tiny-random"
C, CHAT = "/v1/completions", "/v1/chat/completions"

BOTH, ENGINE, ROUTER = frozenset({"engine", "router"}), frozenset({"engine"}), frozenset({"router"})


@dataclass(frozen=True)
class Case:
    id: str
    data: bytes
    expect: int | str | None  # exact status, "4xx", or None (no answer: the client hung up)
    code: str | None = None  # the error code that must come back, where it matters
    then: str = "wait"  # wait | stall (send nothing more) | abort (reset at once) |
    #                     read-abort (reset once the first bytes of the answer arrived)
    targets: frozenset[str] = BOTH
    shape: bool = True  # an OpenAI JSON error body


def request(method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None,
            length: int | None = None) -> bytes:
    """An HTTP/1.1 request; Content-Length is len(body) unless `length` says otherwise."""
    head = {"Host": "kvfleet", "Connection": "close", "Content-Type": "application/json",
            **(headers or {})}
    if method in ("POST", "PUT") and "Transfer-Encoding" not in head:
        head.setdefault("Content-Length", str(len(body) if length is None else length))
    lines = "".join(f"{k}: {v}\r\n" for k, v in head.items())
    return f"{method} {path} HTTP/1.1\r\n{lines}\r\n".encode() + body


def post(body: Any, path: str = C, **kw: Any) -> bytes:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    return request("POST", path, raw, **kw)


def nest(depth: int, leaf: str = "1", kind: str = "[") -> str:
    if kind == "[":
        return "[" * depth + leaf + "]" * depth
    return '{"a":' * depth + leaf + "}" * depth


def _cases() -> list[Case]:
    out: list[Case] = []

    def add(id: str, data: bytes, expect: int | str | None = "4xx", **kw: Any) -> None:  # noqa: A002
        out.append(Case(id, data, expect, **kw))

    # --- pathological nesting: refused before any parse that could recurse ---
    for depth in (65, 200, 1000, 30000):
        add(f"deep-prompt-list-{depth}", post(f'{{"prompt": {nest(depth)}}}'.encode()), 400,
            code="json_too_deep")
        obj = nest(min(depth, 10000), kind="{")  # 6 bytes a level: stay under MAX_BODY
        add(f"deep-object-{depth}", post(f'{{"prompt": "x", "user": {obj}}}'.encode()), 400,
            code="json_too_deep")
    add("deep-top-level", post(nest(5000).encode()), 400, code="json_too_deep")
    add("deep-chat-content", post(
        f'{{"messages": [{{"role": "user", "content": {nest(3000, chr(34) + "hi" + chr(34))}}}]}}'
        .encode(), CHAT), 400, code="json_too_deep")
    add("deep-metadata", post(f'{{"prompt": "x", "metadata": {nest(500, "{}", "{")}}}'.encode()),
        400, code="json_too_deep")
    add("deep-unbalanced", post(b'{"prompt": ' + b"[" * 20000), 400, code="json_too_deep")
    # --- numbers with thousands of digits (Python's int parser is quadratic, then refuses) ---
    digits = "9" * 5000
    for field in ("max_tokens", "seed", "priority", "top_k", "n", "max_completion_tokens"):
        add(f"digits-{field}", post(f'{{"prompt": "x", "{field}": {digits}}}'.encode()), 400,
            code="number_too_long")
    add("digits-65", post(f'{{"prompt": "x", "max_tokens": {"1" * 65}}}'.encode()), 400,
        code="number_too_long")
    add("digits-negative", post(f'{{"prompt": "x", "seed": -{digits}}}'.encode()), 400,
        code="number_too_long")
    add("digits-fraction", post(f'{{"prompt": "x", "temperature": 0.{"0" * 5000}1}}'.encode()),
        400, code="number_too_long")
    add("digits-exponent", post(f'{{"prompt": "x", "temperature": 1e{digits}}}'.encode()), 400,
        code="number_too_long")
    add("digits-token-id", post(f'{{"prompt": [1, 2, {digits}]}}'.encode()), 400,
        code="number_too_long")
    add("digits-chat", post(f'{{"messages": [], "max_tokens": {digits}}}'.encode(), CHAT), 400,
        code="number_too_long")
    # --- not JSON numbers, and floats beyond a double ---
    for const in ("NaN", "Infinity", "-Infinity"):
        add(f"constant-{const}", post(f'{{"prompt": "x", "temperature": {const}}}'.encode()),
            400, code="invalid_json")
    add("float-overflow-temperature", post(b'{"prompt": "x", "temperature": 1e999}'))
    add("float-overflow-top-p", post(b'{"prompt": "x", "top_p": -1e400}'))
    add("float-max-tokens", post({"prompt": "x", "max_tokens": 1e300}))
    add("int-max-tokens-huge", post({"prompt": "x", "max_tokens": 10**40}))
    add("int-seed-huge", post({"prompt": "x", "seed": 10**40}))
    add("int-priority-huge", post({"prompt": "x", "priority": 10**40}))
    add("int-token-id-huge", post({"prompt": [10**30]}))
    add("int-token-id-negative", post({"prompt": [-1, 5]}))
    # --- malformed bodies ---
    for name, raw in [("empty", b""), ("open-brace", b"{"), ("trailing-comma", b'{"prompt": "x",}'),
                      ("two-docs", b'{"prompt": "x"} {}'), ("single-quotes", b"{'prompt': 'x'}"),
                      ("not-utf8", b'{"prompt": "\xff\xfe"}'), ("null", b"null"), ("list", b"[]"),
                      ("string", b'"prompt"'), ("number", b"123"), ("true", b"true"),
                      ("nul-bytes", b"\x00" * 64), ("bom-garbage", b"\xef\xbb\xbf{"),
                      ("comment", b'{"prompt": "x" /* hi */}')]:
        add(f"malformed-{name}", post(raw))
    add("lone-surrogate", post(b'{"prompt": "\\ud800\\udfff\\ud800"}'))
    add("lone-surrogate-chat", post(
        b'{"messages": [{"role": "user", "content": "\\udc00"}]}', CHAT))
    # --- wrong types, field by field ---
    wrong: list[tuple[str, dict[str, Any], str]] = [
        ("model-int", {"model": 5, "prompt": "x"}, C),
        ("model-list", {"model": ["a"], "prompt": "x"}, C),
        ("model-unknown", {"model": "gpt-9", "prompt": "x"}, C),
        ("model-huge", {"model": "m" * 30000, "prompt": "x"}, C),
        ("prompt-missing", {}, C),
        ("prompt-int", {"prompt": 7}, C), ("prompt-dict", {"prompt": {}}, C),
        ("prompt-empty-list", {"prompt": []}, C), ("prompt-mixed-list", {"prompt": ["a", 1]}, C),
        ("prompt-nested-ids", {"prompt": [[1, 2], "a"]}, C),
        ("prompt-bool-ids", {"prompt": [True]}, C),
        ("prompt-float-ids", {"prompt": [1.5, 2.5]}, C), ("prompt-null", {"prompt": None}, C),
        ("messages-missing", {}, CHAT), ("messages-string", {"messages": "hi"}, CHAT),
        ("messages-empty", {"messages": []}, CHAT),
        ("messages-of-strings", {"messages": ["hi"]}, CHAT),
        ("message-content-int", {"messages": [{"role": "user", "content": 5}]}, CHAT),
        ("message-role-int", {"messages": [{"role": 1, "content": "x"}]}, CHAT),
        ("message-role-unknown", {"messages": [{"role": "wizard", "content": "x"}]}, CHAT),
        ("message-content-parts-bad", {"messages": [{"role": "user", "content": [5]}]}, CHAT),
        ("message-null", {"messages": [None]}, CHAT),
        ("max-tokens-string", {"prompt": "x", "max_tokens": "5"}, C),
        ("max-tokens-float", {"prompt": "x", "max_tokens": 2.5}, C),
        ("max-tokens-list", {"prompt": "x", "max_tokens": [5]}, C),
        ("max-tokens-negative", {"prompt": "x", "max_tokens": -1}, C),
        ("max-tokens-zero", {"prompt": "x", "max_tokens": 0}, C),
        ("max-tokens-bool", {"prompt": "x", "max_tokens": True}, C),
        ("temperature-string", {"prompt": "x", "temperature": "hot"}, C),
        ("temperature-list", {"prompt": "x", "temperature": [0]}, C),
        ("temperature-negative", {"prompt": "x", "temperature": -0.5}, C),
        ("top-p-string", {"prompt": "x", "top_p": "1"}, C),
        ("top-k-float", {"prompt": "x", "top_k": 1.5}, C),
        ("stream-string", {"prompt": "x", "stream": "yes"}, C),
        ("stream-int", {"prompt": "x", "stream": 1}, C),
        ("stop-int", {"prompt": "x", "stop": 5}, C),
        ("stop-list-int", {"prompt": "x", "stop": [5]}, C),
        ("stop-many", {"prompt": "x", "stop": ["s"] * 5000}, C),
        ("n-two", {"prompt": "x", "n": 2}, C), ("seed-float", {"prompt": "x", "seed": 1.5}, C),
        ("user-int", {"prompt": "x", "user": 5}, C),
        ("priority-string", {"prompt": "x", "priority": "hi"}, C),
        ("stream-options-int", {"prompt": "x", "stream": True, "stream_options": 5}, C),
        ("logprobs", {"prompt": "x", "logprobs": 5}, C), ("echo", {"prompt": "x", "echo": True}, C),
        ("kv-params-string", {"prompt": "x", "kv_transfer_params": "x"}, C),
        ("kv-params-list", {"prompt": "x", "kv_transfer_params": [1]}, C),
        ("kv-params-bad-host", {"prompt": "x", "kv_transfer_params": {
            "do_remote_prefill": True, "remote_host": 5, "remote_port": "x"}}, C),
        ("kv-params-peer-prefix-string", {"prompt": "x", "kv_transfer_params": {
            "peer_prefix": "x"}}, C),
        ("kv-params-peer-prefix-path", {"prompt": "x", "kv_transfer_params": {"peer_prefix": {
            "url": "http://127.0.0.1:1/admin/config", "block_hashes": [1]}}}, C),
        ("kv-params-peer-prefix-hashes", {"prompt": "x", "kv_transfer_params": {"peer_prefix": {
            "url": "http://127.0.0.1:1", "block_hashes": [2**64] * 3}}}, C),
        ("tools", {"messages": [{"role": "user", "content": "x"}], "tools": [{}]}, CHAT),
    ]
    for name, body, path in wrong:
        add(f"type-{name}", post(body if "model" in body else {"model": MODEL, **body}, path))
    # the router's own priority header (an engine ignores it)
    add("priority-header-huge", post({"prompt": "x"}, headers={"x-kvfleet-priority": "9" * 5000}),
        targets=ROUTER)
    add("priority-header-text", post({"prompt": "x"}, headers={"x-kvfleet-priority": "urgent"}),
        targets=ROUTER)
    # --- oversized ---
    add("too-large-declared", post({"prompt": "x" * (MAX_BODY + 10)}), 413)
    add("too-large-length-only", request("POST", C, b"{}", length=MAX_BODY * 1000), 413)
    add("too-large-chunked", request("POST", C, _chunked(b"x" * (MAX_BODY + 4096)),
                                     headers={"Transfer-Encoding": "chunked"}), 413)
    add("prompt-over-context", post({"prompt": "x" * 40000, "max_tokens": 1}))
    add("max-tokens-over-context", post({"prompt": "x", "max_tokens": 10**9}))
    # --- HTTP that is wrong before any handler (the server's protocol answers) ---
    add("get-completions", request("GET", C), 405)
    add("put-completions", request("PUT", C, b"{}"), 405)
    add("unknown-path", request("GET", "/v2/anything"), 404)
    add("path-traversal", request("GET", "/../../etc/passwd"), "4xx")
    add("header-over-8k", request("GET", "/health", headers={"X-Big": "a" * 9000}), 400)
    add("url-over-8k", request("GET", "/health?" + "a" * 9000), 400)
    add("many-headers", request("GET", "/health", headers={f"X-H{i}": "1" for i in range(300)}),
        400)
    add("content-length-text", request("POST", C, b"{}", headers={"Content-Length": "abc"}), 400)
    add("content-length-negative", request("POST", C, b"{}", headers={"Content-Length": "-5"}),
        400)
    add("cl-and-te", request("POST", C, _chunked(b"{}"), headers={
        "Transfer-Encoding": "chunked", "Content-Length": "2"}), 400)
    add("chunk-size-not-hex", request("POST", C, b"zz\r\nabc\r\n0\r\n\r\n",
                                      headers={"Transfer-Encoding": "chunked"}), 400)
    add("chunk-size-huge", request("POST", C, b"fffffffffffffffffff\r\nabc\r\n0\r\n\r\n",
                                   headers={"Transfer-Encoding": "chunked"}), "4xx")
    add("chunk-missing-crlf", request("POST", C, b"2\r\n{}XX3\r\nabc\r\n0\r\n\r\n",
                                      headers={"Transfer-Encoding": "chunked"}), 400)
    add("te-unknown", request("POST", C, b"{}", headers={"Transfer-Encoding": "gzip, rot13"}),
        "4xx")
    add("tls-client-hello", bytes.fromhex("16030100c4010000c00303") + bytes(range(32)) * 6, 400)
    add("http2-preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 32, 400)
    add("ssh-banner", b"SSH-2.0-OpenSSH_9.6\r\n\r\n", 400)
    add("binary-garbage", bytes(range(256)) * 4 + b"\r\n\r\n", 400)
    add("request-line-only-method", b"POST\r\n\r\n", 400)
    add("request-line-no-version", b"POST /v1/completions\r\nContent-Length: 2\r\n\r\n{}",
        "4xx")
    add("http-version-9", b"GET /health HTTP/9.9\r\nHost: x\r\n\r\n", "4xx")
    add("method-junk", b"G\x01T /health HTTP/1.1\r\nHost: x\r\n\r\n", 400)
    add("header-no-colon", b"GET /health HTTP/1.1\r\nHost x\r\n\r\n", 400)
    add("header-nul", b"GET /health HTTP/1.1\r\nHost: x\x00y\r\n\r\n", 400)
    add("header-obs-fold", b"GET /health HTTP/1.1\r\nHost: x\r\nX-A: a\r\n  b\r\n\r\n", 400)
    add("bare-lf-headers", b"POST /v1/completions HTTP/1.1\nHost: x\nContent-Length: 2\n\n{}",
        "4xx")
    # --- slow and broken uploads ---
    half = b'{"prompt": "slow'
    add("stall-mid-body", request("POST", C, half, length=200), 408, code="body_timeout",
        then="stall")
    add("stall-no-body", request("POST", C, b"", length=50), 408, code="body_timeout",
        then="stall")
    add("stall-chat", request("POST", CHAT, half, length=500), 408, code="body_timeout",
        then="stall")
    add("stall-chunked", request("POST", C, b"10\r\n" + half[:8],
                                 headers={"Transfer-Encoding": "chunked"}), 408,
        code="body_timeout", then="stall")
    add("stall-chunked-between", request("POST", C, b"2\r\n{}\r\n",
                                         headers={"Transfer-Encoding": "chunked"}), 408,
        code="body_timeout", then="stall")
    for i, cut in enumerate((1, 8, len(half))):
        add(f"abort-mid-body-{i}", request("POST", C, half[:cut], length=300), None, then="abort")
    add("abort-after-headers", request("POST", C, b"", length=300), None, then="abort")
    add("abort-mid-chunked", request("POST", C, b"100\r\nabc",
                                     headers={"Transfer-Encoding": "chunked"}), None, then="abort")
    add("abort-mid-headers", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Le", None,
        then="abort")
    long = {"model": MODEL, "prompt": "a client that leaves", "max_tokens": 200}
    add("abort-whole-request", post({**long, "stream": True}), None, then="abort")
    add("abort-whole-request-unstreamed", post(long), None, then="abort")
    add("abort-mid-stream", post({**long, "stream": True}), None, then="read-abort")
    add("abort-mid-stream-chat", post({"model": MODEL, "max_tokens": 200, "stream": True,
                                       "messages": [{"role": "user", "content": "bye"}]}, CHAT),
        None, then="read-abort")
    # --- the admin API: missing, wrong and misplaced tokens (router) ---
    cfg = json.dumps({"version": 99}).encode()
    for name, headers, path in [
        ("none", {}, "/admin/config"),
        ("wrong", {"Authorization": "Bearer nope"}, "/admin/config"),
        ("prefix", {"Authorization": f"Bearer {ADMIN_TOKEN[:-1]}"}, "/admin/config"),
        ("suffix", {"Authorization": f"Bearer {ADMIN_TOKEN}x"}, "/admin/config"),
        ("basic", {"Authorization": f"Basic {ADMIN_TOKEN}"}, "/admin/config"),
        ("no-scheme", {"Authorization": ADMIN_TOKEN}, "/admin/config"),
        ("empty-bearer", {"Authorization": "Bearer "}, "/admin/config"),
        ("x-api-key", {"X-Api-Key": ADMIN_TOKEN}, "/admin/config"),
        ("cookie", {"Cookie": f"token={ADMIN_TOKEN}"}, "/admin/config"),
        ("query", {}, f"/admin/config?token={ADMIN_TOKEN}"),
        ("query-access-token", {}, f"/admin/config?access_token={ADMIN_TOKEN}"),
        ("proxy-auth", {"Proxy-Authorization": f"Bearer {ADMIN_TOKEN}"}, "/admin/config"),
        ("unicode", {"Authorization": "Bearer tökén"}, "/admin/config"),
        ("other-path", {}, "/admin/anything"),
        ("bare-admin", {}, "/admin"),
        ("engine-token", {"Authorization": f"Bearer {ENGINE_TOKEN}"}, "/admin/config"),
    ]:
        add(f"admin-get-{name}", request("GET", path, headers=headers), 401, targets=ROUTER)
        add(f"admin-put-{name}", request("PUT", path, cfg, headers=headers), 401, targets=ROUTER)
    add("admin-token-in-body", request("PUT", "/admin/config", json.dumps(
        {"version": 99, "token": ADMIN_TOKEN}).encode()), 401, targets=ROUTER)
    add("admin-unauth-deep", request("PUT", "/admin/config", nest(50000).encode()), 401,
        targets=ROUTER)
    add("admin-unauth-digits", request("PUT", "/admin/config", f'{{"version": {digits}}}'
                                       .encode()), 401, targets=ROUTER)
    auth = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    for name, raw in [
        ("nan-timeout", b'{"version": 99, "queue": {"timeout_s": NaN}}'),
        ("inf-first-byte", b'{"version": 99, "timeouts": {"first_byte_s": Infinity}}'),
        ("tiny-probe", b'{"version": 99, "health": {"probe_interval_s": 1e-9}}'),
        ("huge-queue", b'{"version": 99, "queue": {"max_size": 1000000000000}}'),
        ("many-retries", b'{"version": 99, "retries": {"max_attempts": 1000}}'),
        ("huge-body-limit", b'{"version": 99, "limits": {"max_body_bytes": 1000000000000000}}'),
        ("zero-weights", b'{"version": 99, "policy": {"weights": {"prefix": 0, "queue": 0}}}'),
        ("digits-version", f'{{"version": {digits}}}'.encode()),
        ("deep", nest(3000).encode()),
        ("not-json", b"{version"),
        ("stale-version", b'{"version": 0}'),
    ]:
        add(f"admin-nonsense-{name}", request("PUT", "/admin/config", raw, headers=auth), "4xx",
            targets=ROUTER)
    # --- the engine's fleet-internal endpoints: KV events and KV transfer need its token ---
    for name, headers, path in [
        ("none", {}, "/v1/kv_events"),
        ("wrong", {"Authorization": "Bearer nope"}, "/v1/kv_events"),
        ("query", {}, f"/v1/kv_events?token={ENGINE_TOKEN}"),
        ("basic", {"Authorization": f"Basic {ENGINE_TOKEN}"}, "/v1/kv_events"),
        ("admin-token", {"Authorization": f"Bearer {ADMIN_TOKEN}"}, "/v1/kv_events"),
        ("transfer-none", {}, "/v1/kv_transfer/some-handle"),
        ("transfer-wrong", {"Authorization": "Bearer x"}, "/v1/kv_transfer/some-handle"),
    ]:
        add(f"internal-{name}", request("GET", path, headers=headers), 401, targets=ENGINE)
    for name, headers in [("export-none", {}), ("export-wrong", {"Authorization": "Bearer x"})]:
        add(f"internal-{name}", request("POST", "/v1/kv_cache/export", b'{"block_hashes": [1]}',
                                        headers=headers), 401, targets=ENGINE)
    token = {"Authorization": f"Bearer {ENGINE_TOKEN}"}
    for name, path, status in [("since-text", "/v1/kv_events?since=abc", 400),
                               ("since-digits", f"/v1/kv_events?since={digits}", 400),
                               ("since-float", "/v1/kv_events?since=1.5", 400),
                               ("transfer-unknown", "/v1/kv_transfer/nope", 404),
                               ("transfer-garbage", "/v1/kv_transfer/%00%ff..%2f", 404)]:
        add(f"internal-token-{name}", request("GET", path, headers=token), status,
            targets=ENGINE)
    for name, raw in [("empty", b"{}"), ("hashes-text", b'{"block_hashes": "x"}'),
                      ("hashes-negative", b'{"block_hashes": [-1]}'), ("not-json", b"{x")]:
        add(f"internal-token-export-{name}", request("POST", "/v1/kv_cache/export", raw,
                                                     headers=token), 400, targets=ENGINE)
    add("internal-token-export-hashes-many", request(  # 400 past the count, 413 past the body
        "POST", "/v1/kv_cache/export", b'{"block_hashes": [' + b"1," * 9000 + b'1]}',
        headers=token), "4xx", targets=ENGINE)
    # a client's kv_transfer_params would make an engine dial any host with the engine token
    for name, params in [("ssrf", {"do_remote_prefill": True, "remote_host": "203.0.113.9",
                                   "remote_port": 80, "remote_handle": "h",
                                   "remote_block_ids": [1]}),
                         ("decode", {"do_remote_decode": True}), ("empty", {}),
                         ("peer-prefix", {"peer_prefix": {"url": "http://203.0.113.9",
                                                          "block_hashes": [1]}})]:
        add(f"router-owned-kv-params-{name}", post({"prompt": "x", "kv_transfer_params": params}),
            400, code="router_owned_field", targets=ROUTER)
    return out


def _chunked(body: bytes, size: int = 4096) -> bytes:
    parts = [b"%x\r\n%s\r\n" % (len(body[i:i + size]), body[i:i + size])
             for i in range(0, len(body), size)]
    return b"".join(parts) + b"0\r\n\r\n"


CASES = _cases()


def cases_for(target: str) -> list[Case]:
    return [c for c in CASES if target in c.targets]
