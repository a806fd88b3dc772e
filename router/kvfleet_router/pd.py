"""Prefill/decode orchestration for disaggregated pools (vLLM NixlConnector conventions).

1. Pick the decode endpoint first (its prefix cache decides how much prompt is uncached).
2. If uncached prompt tokens on it exceed pd.prefill_threshold_tokens and a prefill
   endpoint is eligible, send the prefill leg: the client body with max_tokens=1,
   stream=false and kv_transfer_params={do_remote_decode: true, do_remote_prefill: false,
   remote_*: null}. The prefill engine answers with kv_transfer_params naming its blocks.
3. Send the decode leg: the client body plus the returned kv_transfer_params, streamed back
   to the client as usual. If the prefill leg fails, or every prefill endpoint is busy or
   unhealthy, the decode endpoint runs the prompt itself (slower, never lost).
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import TYPE_CHECKING, Any

from aiohttp import web
from kvfleet_engine import contract
from multidict import CIMultiDict

from kvfleet_router.dispatch import Rejected
from kvfleet_router.proxy import BackendFailure, forward_headers
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import Routed

if TYPE_CHECKING:
    from kvfleet_router.app import RouterApp

log = logging.getLogger(__name__)
REQUEST_ID = "X-Request-Id"


def prefill_body(body: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out["max_tokens"] = 1
    if "max_completion_tokens" in out:
        out["max_completion_tokens"] = 1
    out["stream"] = False
    out.pop("stream_options", None)
    out[contract.KV_TRANSFER_PARAMS] = {
        contract.DO_REMOTE_DECODE: True, contract.DO_REMOTE_PREFILL: False,
        "remote_engine_id": None, contract.REMOTE_BLOCK_IDS: None,
        contract.REMOTE_HOST: None, contract.REMOTE_PORT: None,
    }
    return out


def decode_body(body: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    out = dict(body)
    out[contract.KV_TRANSFER_PARAMS] = params
    return out


def needs_prefill(routed: Routed, threshold: int) -> bool:
    e = routed.decision.endpoint
    return e is not None and routed.ctx.uncached_tokens(e.name) > threshold


def leg_headers(request: web.Request) -> CIMultiDict[str]:
    """Both legs carry the same X-Request-Id, as vLLM's disaggregation proxy sends."""
    headers = forward_headers(request.headers)
    if REQUEST_ID not in headers:
        headers[REQUEST_ID] = f"kvfleet-{uuid.uuid4().hex}"
    return headers


async def run_prefill(app: RouterApp, request: web.Request, info: RequestInfo,
                      policy: str | None, headers: CIMultiDict[str]) -> dict[str, Any] | None:
    """The prefill leg; returns the engine's kv_transfer_params or None on any failure.

    It never queues: it already holds a decode slot, and a busy prefill tier is better
    skipped (the decode endpoint computes the prompt itself) than waited for."""
    routed = app.dispatcher.try_route(info, "prefill", policy, frozenset())
    e = routed.decision.endpoint
    if e is None:
        return None
    raw = json.dumps(prefill_body(info.body)).encode()
    try:
        status, body = await app.forwarder.post_json(e, request.path, raw, headers)
        if status != 200:
            log.warning("prefill on %s answered %s", e.name, status)
            return None
        params = json.loads(body).get(contract.KV_TRANSFER_PARAMS)
        e.breaker.record_success()
        return params if isinstance(params, dict) else None
    except BackendFailure as exc:
        app.dispatcher._failure(e, exc.kind, routed.ctx.now)
        return None
    except (ValueError, AttributeError):
        log.warning("prefill on %s returned a body without kv_transfer_params", e.name)
        return None
    finally:
        app.dispatcher.release(e)


async def serve_disaggregated(app: RouterApp, request: web.Request, raw: bytes,
                              info: RequestInfo, policy: str | None) -> web.StreamResponse:
    try:
        decode = await app.dispatcher.acquire(info, "decode", policy, frozenset())
    except Rejected as rej:
        return rej.response
    threshold = app.core.cfg.pd.prefill_threshold_tokens
    headers = leg_headers(request)
    try:
        if needs_prefill(decode, threshold) and app.has_role("prefill"):
            params = await run_prefill(app, request, info, policy, headers)
            app.metrics.pd_prefills.labels("failed" if params is None else "ok").inc()
            if params is not None:
                raw = json.dumps(decode_body(info.body, params)).encode()
    except BaseException:
        app.dispatcher.release(decode.decision.endpoint)  # type: ignore[arg-type]
        raise
    return await app.dispatcher.serve(request, raw, info, "decode", policy, first=decode,
                                      headers=headers)
