"""Prefill/decode orchestration for disaggregated pools (vLLM NixlConnector conventions).

1. Pick the decode endpoint first (its prefix cache decides how much prompt is uncached).
2. If uncached prompt tokens on it exceed pd.prefill_threshold_tokens and a prefill
   endpoint is eligible, send the prefill leg: the client body with max_tokens=1,
   stream=false and kv_transfer_params={do_remote_decode: true, do_remote_prefill: false,
   remote_*: null}. The prefill engine answers with kv_transfer_params naming its blocks.
3. Send the decode leg: the client body plus the returned kv_transfer_params, streamed back
   to the client as usual. If the prefill leg fails, or every prefill endpoint is busy or
   unhealthy, the decode endpoint runs the prompt itself (slower, never lost).

Whether step 2 happens is the decider's call (pd_deciders.py, config `pd.decider`).
`Disaggregator` is built from what it uses: the routing core (roles, config), the
dispatcher (acquire, release, serve), the forwarder (the prefill side call), the health
feedback (the prefill leg's failures count like any other) and the metrics.
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from aiohttp import web
from kvfleet_engine import contract
from multidict import CIMultiDict

from kvfleet_router.config import RouterConfig
from kvfleet_router.dispatch import Dispatcher, Rejected
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.metrics import RouterMetrics
from kvfleet_router.pd_deciders import PDDecider, build_decider
from kvfleet_router.proxy import BackendFailure, Forwarder, forward_headers
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import RouterCore

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


def leg_headers(request: web.Request) -> CIMultiDict[str]:
    """Both legs carry the same X-Request-Id, as vLLM's disaggregation proxy sends."""
    headers = forward_headers(request.headers)
    if REQUEST_ID not in headers:
        headers[REQUEST_ID] = f"kvfleet-{uuid.uuid4().hex}"
    return headers


class Disaggregator:
    def __init__(self, core: RouterCore, dispatcher: Dispatcher, forwarder: Forwarder,
                 feedback: HealthFeedback, metrics: RouterMetrics) -> None:
        self.core = core
        self.dispatcher = dispatcher
        self.forwarder = forwarder
        self.feedback = feedback
        self.metrics = metrics
        self._decider_cfg: RouterConfig | None = None
        self._decider: PDDecider | None = None

    def decider(self) -> PDDecider:
        """The decider of the config in force (rebuilt after a reload)."""
        if self._decider is None or self._decider_cfg is not self.core.cfg:
            self._decider_cfg, self._decider = self.core.cfg, build_decider(self.core.cfg)
        return self._decider

    async def run_prefill(self, request: web.Request, info: RequestInfo, policy: str | None,
                          headers: CIMultiDict[str]) -> dict[str, Any] | None:
        """The prefill leg; returns the engine's kv_transfer_params or None on any failure.

        It never queues: it already holds a decode slot, and a busy prefill tier is better
        skipped (the decode endpoint computes the prompt itself) than waited for."""
        routed = self.dispatcher.try_route(info, "prefill", policy, frozenset())
        e = routed.decision.endpoint
        if e is None:
            return None
        raw = json.dumps(prefill_body(info.body)).encode()
        try:
            status, body = await self.forwarder.post_json(e, request.path, raw, headers)
            if status != 200:
                log.warning("prefill on %s answered %s", e.name, status)
                return None
            params = json.loads(body).get(contract.KV_TRANSFER_PARAMS)
            self.feedback.success(e)
            return params if isinstance(params, dict) else None
        except BackendFailure as exc:
            self.feedback.failure(e, exc.kind, routed.ctx.now)
            return None
        except (ValueError, AttributeError):
            log.warning("prefill on %s returned a body without kv_transfer_params", e.name)
            return None
        finally:
            self.dispatcher.release(e)

    async def serve(self, request: web.Request, raw: bytes, info: RequestInfo,
                    policy: str | None) -> web.StreamResponse:
        try:
            decode = await self.dispatcher.acquire(info, "decode", policy, frozenset())
        except Rejected as rej:
            return rej.response
        headers = leg_headers(request)
        try:
            if self.decider().wants_prefill(decode) and self.core.has_role("prefill"):
                params = await self.run_prefill(request, info, policy, headers)
                self.metrics.pd_prefills.labels("failed" if params is None else "ok").inc()
                if params is not None:
                    raw = json.dumps(decode_body(info.body, params)).encode()
        except BaseException:
            self.dispatcher.release(decode.decision.endpoint)  # type: ignore[arg-type]
            raise
        return await self.dispatcher.serve(request, raw, info, "decode", policy, first=decode,
                                           headers=headers)
