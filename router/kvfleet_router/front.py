"""The client-facing HTTP handlers: the OpenAI API (completions, chat, models), /health and
/metrics. Built from what they use; the wiring into an aiohttp app is in app.py.

A completion is read within the body limits, admitted (admission.py: parsed once, no
tokenizer; policy override and model checked, as the ext_proc front does too), charged to its
tenant's quota (quota_gate.py: API key -> tenant, 401, 429), then handed
to the P/D orchestrator when the pool has decode endpoints, else to the dispatcher as a
unified request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time

import aiohttp
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from kvfleet_engine.contract.http_limits import UploadSlots

from kvfleet_router.admission import admit
from kvfleet_router.config import LimitsConfig
from kvfleet_router.dispatch import Dispatcher
from kvfleet_router.errors import RequestError, error_response
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.pd import Disaggregator
from kvfleet_router.pd_plan import entry_role
from kvfleet_router.proxy import Forwarder
from kvfleet_router.quota_gate import QuotaGate
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore

log = logging.getLogger(__name__)


async def _read(request: web.Request, limit: int) -> bytes:
    too_large = RequestError(f"request body exceeds {limit} bytes", status=413,
                             code="body_too_large", is_closing=True)
    if request.content_length is not None:
        if request.content_length > limit:
            raise too_large
        return await request.read()  # the common case: one C-level read
    chunks: list[bytes] = []  # chunked upload: count as it arrives
    size = 0
    async for chunk in request.content.iter_any():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


async def read_body(request: web.Request, limits: LimitsConfig, uploads: UploadSlots) -> bytes:
    """The raw body, within limits: at most `max_uploads_per_client` unfinished per client
    address (429 at once, body unread), `max_body_bytes` (413), `body_read_timeout_s` for
    all of it (408). A client gone mid-body or a malformed chunked body is a 400 that
    closes the connection, logged as one DEBUG line. A body already received whole (a
    small request's usual case) is no unfinished upload and has nothing left to wait
    for: it is read without a slot or a timer."""
    is_whole = request.content.is_eof()
    addr = ""
    if not is_whole:
        addr = request.remote or ""
        uploads.max_per_client = limits.max_uploads_per_client  # follows config reloads
        if not uploads.acquire(addr):
            raise RequestError(f"more than {limits.max_uploads_per_client} unfinished uploads "
                               "from this address", status=429, code="too_many_uploads",
                               headers={"Retry-After": "1"}, is_closing=True)
    try:
        if is_whole:
            return await _read(request, limits.max_body_bytes)
        async with asyncio.timeout(limits.body_read_timeout_s):
            return await _read(request, limits.max_body_bytes)
    except TimeoutError:
        raise RequestError(f"request body not received within {limits.body_read_timeout_s}s",
                           status=408, code="body_timeout", is_closing=True) from None
    except ConnectionResetError:
        log.debug("client %s went away mid-body", addr or request.remote)
        raise RequestError("client closed the connection mid-body", code="client_gone",
                           is_closing=True) from None
    except (web.RequestPayloadError, HttpProcessingError) as exc:
        raise RequestError(f"malformed request body: {exc}", code="bad_body",
                           is_closing=True) from None
    finally:
        if not is_whole:
            uploads.release(addr)


class OpenAIFront:
    def __init__(self, core: RouterCore, dispatcher: Dispatcher, disaggregator: Disaggregator,
                 forwarder: Forwarder, gate: QuotaGate) -> None:
        self.core = core
        self.dispatcher = dispatcher
        self.disaggregator = disaggregator
        self.forwarder = forwarder  # its pooled session also answers /v1/models
        self.gate = gate  # API key -> tenant, per-tenant quotas (quota_gate.py)
        self.uploads = UploadSlots(core.cfg.limits.max_uploads_per_client)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        key_tenant = self.gate.identify(request)  # 401 before the body is read
        if isinstance(key_tenant, web.Response):
            return key_tenant
        request = self.gate.forwarded(request)  # engines never see a client's API key
        raw = await read_body(request, self.core.cfg.limits, self.uploads)
        info, policy = admit(self.core, raw, request.path, request.headers)
        return await self.gate.serve(request, info, key_tenant,
                                     functools.partial(self._route, raw=raw, info=info,
                                                       policy=policy))

    async def _route(self, request: web.Request, raw: bytes, info: RequestInfo,
                     policy: str | None) -> web.StreamResponse:
        core = self.core  # a large text prompt is tokenized on a thread (text_tokens.py)
        tokenizing = core.text_tokens.offload(info, core.registry.endpoints,
                                              core.precise.block_sizes)
        if tokenizing is not None:
            await asyncio.wrap_future(tokenizing)
        role = entry_role(core)
        if role == "decode":
            return await self.disaggregator.serve(request, raw, info, policy)
        return await self.dispatcher.serve(request, raw, info, role, policy)

    async def models(self, request: web.Request) -> web.Response:
        session = self.forwarder.session
        now = time.monotonic()
        eps = [e for e in self.core.registry.endpoints if e.is_healthy(now)]

        async def one(url: str) -> list[dict[str, object]]:
            try:
                async with session.get(url + "/v1/models",
                                       timeout=aiohttp.ClientTimeout(total=2)) as resp:
                    body = await resp.json()
                    return [m for m in body.get("data", []) if isinstance(m, dict)]
            except (aiohttp.ClientError, TimeoutError, ValueError, AttributeError):
                return []

        seen: dict[str, dict[str, object]] = {}
        for items in await asyncio.gather(*(one(e.url) for e in eps)):
            for m in items:
                seen.setdefault(str(m.get("id")), m)
        if not seen and not eps:
            return error_response("no healthy endpoint", 503, code="no_endpoint")
        return web.json_response({"object": "list", "data": list(seen.values())})


class StatusFront:
    """/health (200 while running; 503 once stopping, so a balancer's health check takes the
    process out while it still serves: `--stop-delay-s`) and the router's own /metrics."""

    def __init__(self, core: RouterCore, metrics: RouterMetrics) -> None:
        self.core = core
        self.metrics = metrics
        self.is_stopping = False

    def begin_stopping(self) -> None:
        self.is_stopping = True

    async def health(self, request: web.Request) -> web.Response:
        now = time.monotonic()
        eps = self.core.registry.endpoints
        return web.json_response({"status": "stopping" if self.is_stopping else "ok",
                                  "config_version": self.core.cfg.version,
                                  "num_endpoints": len(eps),
                                  "num_healthy": sum(e.is_healthy(now) for e in eps)},
                                 status=503 if self.is_stopping else 200)

    async def metrics_text(self, request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.render(),
                            headers={"Content-Type": "text/plain; version=0.0.4"})
