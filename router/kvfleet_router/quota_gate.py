"""The HTTP edge of tenancy and quotas: API key -> tenant (401), the tenant's rate limits
(429), OpenAI's `x-ratelimit-*` headers, and the tokens settled when the answer ends.

    key_tenant = gate.identify(request)          # a web.Response (401) or the key's tenant
    request = gate.forwarded(request)            # without the client's key, for engines
    ...read and admit the body...
    return await gate.serve(request, info, key_tenant, forward)   # 429, or forward()

Decisions are quota.py's (pure); this file only reads the request, writes headers and
measures the answer:
- **Who.** With an API-key file (`--api-keys-file`), the tenant is the key's, and a missing
  or unknown key is a 401 in OpenAI's shape (`invalid_api_key`); the tenant header is then
  ignored (a client cannot claim another tenant's quota) and the key is not forwarded to
  engines. Without keys the tenant is the request's (`flow_control.tenant_header`, else
  `flow_control.default_tenant`; request_info.py).
- **Charge.** One request and `prompt estimate + max_tokens × n` tokens (max_tokens, or
  `quotas.default_max_tokens` when the request sets none; the prompt estimated from its
  length as routing does, `prefix.chars_per_token`).
- **Settle.** A JSON answer's `usage.total_tokens`; a stream's final `usage` event when it
  has one, else the prompt estimate plus one token per content event; an error answer with
  no usage used nothing. An answer that never ended (the client went away mid-exchange)
  keeps its whole charge.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web
from multidict import CIMultiDict

from kvfleet_router.api_keys import ApiKeys, bearer_key
from kvfleet_router.config import RouterConfig
from kvfleet_router.errors import openai_error
from kvfleet_router.quota import REQUESTS, LimitState, QuotaBook, Verdict, duration_text
from kvfleet_router.request_info import RequestInfo

_TAIL_BYTES = 4096  # the end of a stream kept to find its usage event
_LIMIT_TITLE = {REQUESTS: "requests per min (RPM)", "tokens": "tokens per min (TPM)"}


def ratelimit_headers(states: tuple[LimitState, ...]) -> dict[str, str]:
    """OpenAI's headers: x-ratelimit-{limit,remaining,reset}-{requests,tokens}."""
    out: dict[str, str] = {}
    for s in states:
        out[f"x-ratelimit-limit-{s.name}"] = str(s.limit)
        out[f"x-ratelimit-remaining-{s.name}"] = str(s.remaining)
        out[f"x-ratelimit-reset-{s.name}"] = duration_text(s.reset_s)
    return out


def refusal(tenant: str, verdict: Verdict) -> web.Response:
    """429 with OpenAI's `rate_limit_exceeded` error (type `requests` or `tokens`)."""
    name = verdict.limit_name or REQUESTS
    state = next((s for s in verdict.states if s.name == name), None)
    limit = state.limit if state is not None else 0
    headers = ratelimit_headers(verdict.states)
    if verdict.is_too_large:
        message = (f"Request too large for tenant {tenant!r} on {_LIMIT_TITLE[name]}: Limit "
                   f"{limit}, Requested {verdict.requested}. The input or output tokens must "
                   "be reduced in order to run successfully.")
    else:
        remaining = state.remaining if state is not None else 0
        message = (f"Rate limit reached for tenant {tenant!r} on {_LIMIT_TITLE[name]}: Limit "
                   f"{limit}, Remaining {remaining}, Requested {verdict.requested}. Please "
                   f"try again in {duration_text(verdict.retry_after_s)}.")
        headers["Retry-After"] = str(max(1, math.ceil(verdict.retry_after_s)))
    return openai_error(message, 429, err_type=name, code="rate_limit_exceeded",
                        headers=headers)


def charged_tokens(info: RequestInfo, chars_per_token: float, default_max_tokens: int) -> int:
    """What a request is charged against TPM at admission."""
    body = info.body
    is_set = "max_completion_tokens" in body or "max_tokens" in body
    max_tokens = info.max_tokens if is_set else default_max_tokens
    n = body.get("n", 1)
    n = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 128 else 1
    return info.estimated_prompt_tokens(chars_per_token) + max_tokens * n


@dataclass(slots=True)
class StreamMeter:
    """What went by of an SSE answer: data events, and its tail (the usage event)."""

    num_events: int = 0
    tail: bytes = b""

    def feed(self, chunk: bytes) -> None:
        self.num_events += chunk.count(b"data:")
        self.tail = (self.tail + chunk)[-_TAIL_BYTES:]

    def usage_tokens(self) -> int | None:
        for line in reversed(self.tail.split(b"\n")):
            if line.startswith(b"data:") and b'"usage"' in line:
                return _total_tokens(line[5:])
        return None

    def num_content_events(self) -> int:
        done = self.tail.count(b"data: [DONE]")
        has_usage = self.usage_tokens() is not None
        return max(0, self.num_events - done - int(has_usage))


def _total_tokens(raw: bytes) -> int | None:
    try:
        usage = json.loads(raw).get("usage")
    except (ValueError, AttributeError):
        return None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    return total if isinstance(total, int) and total >= 0 else None


@dataclass(slots=True)
class Charge:
    tenant: str
    tokens: int
    prompt_tokens: int
    headers: dict[str, str]
    meter: StreamMeter | None = None


_CHARGE = web.RequestKey("kvfleet.quota_charge", Charge)  # the request's Charge


class QuotaGate:
    """Built from the config in force (a getter), the key file (or None) and a clock."""

    def __init__(self, cfg: Callable[[], RouterConfig], keys: ApiKeys | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 on_reject: Callable[[str, str | None], None] | None = None) -> None:
        self._cfg = cfg
        self.keys = keys
        self.clock = clock
        # (reason, the tenant refused: None when no key named one)
        self.on_reject = on_reject or (lambda reason, tenant: None)
        self.book = QuotaBook(cfg().quotas)

    def configure(self, cfg: RouterConfig) -> None:
        self.book.configure(cfg.quotas)

    def identify(self, request: web.Request) -> web.Response | str | None:
        """The API key's tenant; a 401 when keys are configured and this one is missing or
        unknown; None without keys. The key itself goes nowhere (no log, no error)."""
        return self.tenant_of(request.headers.get("Authorization"))

    def tenant_of(self, authorization: str | None) -> web.Response | str | None:
        """`identify` from the Authorization header's value (the ext_proc front's way)."""
        if self.keys is None:
            return None
        self.keys.maybe_reload(self.clock())
        key = bearer_key(authorization)
        if key is None:
            self.on_reject("no-api-key", None)
            return openai_error("You didn't provide an API key. Send it in an Authorization "
                                "header using Bearer auth (Authorization: Bearer YOUR_KEY).",
                                401, err_type="invalid_request_error", code=None)
        tenant = self.keys.tenant_of(key)
        if tenant is None:
            self.on_reject("invalid-api-key", None)
            return openai_error("Incorrect API key provided.", 401,
                                err_type="invalid_request_error", code="invalid_api_key")
        return tenant

    def forwarded(self, request: web.Request) -> web.Request:
        """The request as engines see it: without the client's API key when the router
        resolved it (the key is the router's credential, not an engine's). Before its body
        is read (aiohttp clones only then)."""
        if self.keys is None or "Authorization" not in request.headers:
            return request
        headers: CIMultiDict[str] = CIMultiDict(request.headers)
        del headers["Authorization"]
        return request.clone(headers=headers)

    async def serve(self, request: web.Request, info: RequestInfo, key_tenant: str | None,
                    forward: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        """Refuse (429) or charge the tenant, forward, then settle the tokens."""
        got = self.admit(info, key_tenant)
        if got is None:
            return await forward(request)
        if isinstance(got, web.Response):
            return got
        request[_CHARGE] = got  # on_prepare: a stream's headers, and its meter
        resp = await forward(request)  # an exception keeps the whole charge
        if not resp.prepared:  # a whole answer: its headers are still open
            resp.headers.update(got.headers)
        self.book.settle(got.tenant, got.tokens, self._actual(got, resp), self.clock())
        return resp

    def admit(self, info: RequestInfo, key_tenant: str | None) -> Charge | web.Response | None:
        """The tenant's charge, a 429 over its limits, or None when it has none. The key's
        tenant replaces the request's (flow control's bands and shares see it too). The
        ext_proc front stops here: it never reads the answer, so its requests are charged
        their whole `max_tokens` against TPM and never settled."""
        if key_tenant is not None:
            info.tenant = key_tenant
        tenant = info.tenant
        if not self.book.is_limited(tenant):
            return None
        cfg = self._cfg()
        prompt = info.estimated_prompt_tokens(cfg.prefix.chars_per_token)
        tokens = charged_tokens(info, cfg.prefix.chars_per_token, cfg.quotas.default_max_tokens)
        verdict = self.book.admit(tenant, tokens, self.clock())
        if not verdict.is_admitted:
            self.on_reject(f"quota-{verdict.limit_name}", tenant)
            return refusal(tenant, verdict)
        return Charge(tenant, tokens, prompt, ratelimit_headers(verdict.states))

    @staticmethod
    def _actual(charge: Charge, resp: web.StreamResponse) -> int:
        if charge.meter is not None:
            used = charge.meter.usage_tokens()
            if used is not None:
                return used
            return charge.prompt_tokens + charge.meter.num_content_events()
        body = resp.body if isinstance(resp, web.Response) else None
        used = _total_tokens(body) if isinstance(body, bytes) else None
        if used is not None:
            return used
        return 0 if resp.status >= 400 else charge.tokens

    async def on_prepare(self, request: web.Request, response: web.StreamResponse) -> None:
        """aiohttp's on_response_prepare: a limited tenant's answer carries its
        x-ratelimit-* headers (on a stream too: they leave before the first byte), and a
        stream is metered as it passes."""
        charge = request.get(_CHARGE)
        if charge is None:
            return
        response.headers.update(charge.headers)
        if response.content_type == "text/event-stream" and charge.meter is None:
            meter = charge.meter = StreamMeter()
            write = response.write

            async def metered(data: bytes | bytearray | memoryview) -> None:
                meter.feed(bytes(data))
                await write(data)

            response.write = metered  # type: ignore[method-assign]
            write_eof = response.write_eof

            async def metered_eof(data: bytes = b"") -> None:  # a relay's last bytes and end
                if data:
                    meter.feed(bytes(data))
                await write_eof(data)

            response.write_eof = metered_eof  # type: ignore[method-assign]
