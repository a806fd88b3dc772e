"""One ext_proc stream: a request's headers and body in, the pick out, the answer watched.

    ex = Exchange(picker, opts)
    for msg in stream:  responses = await ex.handle(msg)   # replies, in protocol order
    ex.close()                                          # the stream ended: request done

Body modes (from the stream's `protocol_config`; none sent means BUFFERED):
* BUFFERED: headers -> CONTINUE; the whole body -> the pick, as a header mutation on the
  body reply (the gateway holds the headers until then).
* FULL_DUPLEX_STREAMED (GIE's reference gateways): nothing is answered until the body
  ended; then the headers reply carries the pick and the body is handed back whole.
  Response body chunks, when sent, are handed back one for one.
Any other request body mode cannot carry a pick made from the body, and is refused with a
500 naming the setting.

The request counts in flight on its endpoint from the pick until the stream ends (Envoy
keeps the stream open until the HTTP exchange is over), so load-aware scoring sees the
gateway's traffic as it sees the HTTP front's. A response from a fallback moves the
request (and its prompt's prefix record) to the endpoint that served; the primary gets a
connect failure in the health feedback, as does an endpoint for which the gateway itself
answered 502/503/504 without reaching it.

API keys and quotas are the HTTP front's (`quota_gate.py`): a missing or unknown key is a
401, a tenant over its RPM or TPM a 429 with OpenAI's error and `x-ratelimit-*` headers,
and the key is removed from what goes upstream. The picker never reads the answer, so a
request is charged its whole `max_tokens` against TPM (the HTTP front settles on usage).
"""

from __future__ import annotations

import logging
import time
from functools import lru_cache
from urllib.parse import urlsplit

from aiohttp import web
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from kvfleet_router.admission import admit
from kvfleet_router.dispatch import Dispatcher, Rejected
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.errors import RequestError
from kvfleet_router.feedback import HealthFeedback
from kvfleet_router.policies.policy import Decision
from kvfleet_router.proxy import Outcome
from kvfleet_router.quota_gate import QuotaGate
from kvfleet_router.request_info import RequestInfo
from kvfleet_router.router_core import Routed, RouterCore

from . import protocol as gie
from .options import EppOptions

log = logging.getLogger(__name__)
_MODE = processing_mode_pb2.ProcessingMode
_GATEWAY_FAILURES = {502: "connect", 503: "connect", 504: "timeout"}


@lru_cache(maxsize=4096)
def address(url: str) -> str:
    """`ip:port` of an endpoint URL, as the gateway's original-destination cluster wants."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Picker:
    """What every stream shares: the routing core, the dispatcher (hold queue, saturation,
    the decision metrics) and the health feedback. Built once, in app.py."""

    def __init__(self, core: RouterCore, dispatcher: Dispatcher, feedback: HealthFeedback,
                 opts: EppOptions, gate: QuotaGate | None = None) -> None:
        self.core = core
        self.dispatcher = dispatcher
        self.feedback = feedback
        self.opts = opts
        self.gate = gate  # API keys and quotas, shared with the HTTP front

    def endpoint_at(self, addr: str) -> EndpointState | None:
        for e in self.core.registry.endpoints:
            if address(e.url) == addr:
                return e
        return None

    def allowed(self, subset: object) -> frozenset[str] | None:
        if not isinstance(subset, list):
            return None
        wanted = set(subset)
        return frozenset(e.name for e in self.core.registry.endpoints
                         if address(e.url) in wanted)


def _refusal(exc: RequestError) -> pb.ProcessingResponse:
    return gie.immediate(exc.status, str(exc), exc.code, exc.param, exc.headers)


def _rejected(rej: Rejected) -> pb.ProcessingResponse:
    """The dispatcher's 503 (nothing can serve) or 429 (saturated, Retry-After) as is."""
    resp = rej.response
    body = resp.body if isinstance(resp.body, bytes) else b""
    headers = {"retry-after": resp.headers["Retry-After"]} \
        if "Retry-After" in resp.headers else None
    return gie.immediate_raw(resp.status, body, headers,
                             "saturated" if resp.status == 429 else "no_endpoint")


def _gate_refusal(resp: web.Response) -> pb.ProcessingResponse:
    """The quota gate's 401 (API key) or 429 (rate limit, with x-ratelimit-*) as is."""
    body = resp.body if isinstance(resp.body, bytes) else b""
    headers = {k.lower(): v for k, v in resp.headers.items()
               if k.lower() == "retry-after" or k.lower().startswith("x-ratelimit-")}
    return gie.immediate_raw(resp.status, body, headers,
                             "rate_limited" if resp.status == 429 else "unauthorized")


class Exchange:
    def __init__(self, picker: Picker) -> None:
        self.picker = picker
        self.headers: dict[str, str] = {}
        self.path = ""
        self.body = bytearray()
        self.subset: object = None
        self.is_full_duplex = False
        self.is_supported_mode = True
        self.is_response_echoed = False  # full-duplex response body: hand chunks back
        self.is_done = False  # an immediate response went out: the stream is over
        self.routed: Routed | None = None
        self.active: EndpointState | None = None  # counted in flight here
        self.info = RequestInfo()
        self.picked_at = 0.0
        self.ttft_s: float | None = None
        self.status = 0
        self.is_gateway_failure = False

    # --- the stream ---
    async def handle(self, req: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        if req.HasField("metadata_context"):
            subset = gie.metadata_value(req.metadata_context, gie.SUBSET_NAMESPACE,
                                        gie.SUBSET_KEY)
            if subset is not None:
                self.subset = subset
        kind = req.WhichOneof("request")
        if kind == "request_headers":
            if req.HasField("protocol_config"):
                self._read_modes(req.protocol_config)
            return await self._request_headers(req.request_headers)
        if kind == "request_body":
            return await self._request_body(req.request_body)
        if kind == "request_trailers":
            out = [] if self.routed is not None else await self._pick(is_end=False)
            if self.is_done:
                return out
            return out + [pb.ProcessingResponse(request_trailers=pb.TrailersResponse())]
        if kind == "response_headers":
            return self._response_headers(req)
        if kind == "response_body":
            body = req.response_body
            if body.end_of_stream:
                self._finish()
            if self.is_response_echoed:
                return [gie.streamed_response_body(body.body, body.end_of_stream)]
            return [pb.ProcessingResponse(response_body=pb.BodyResponse())]
        if kind == "response_trailers":
            self._finish()
            return [pb.ProcessingResponse(response_trailers=pb.TrailersResponse())]
        return []  # nothing else is defined; never answer what was not asked

    def close(self) -> None:
        """The stream ended (normally, reset or cancelled): the request is over."""
        self._finish()

    # --- request side ---
    def _read_modes(self, cfg: pb.ProtocolConfiguration) -> None:
        mode = cfg.request_body_mode
        self.is_full_duplex = mode == _MODE.FULL_DUPLEX_STREAMED
        self.is_supported_mode = mode in (_MODE.BUFFERED, _MODE.FULL_DUPLEX_STREAMED)
        self.is_response_echoed = cfg.response_body_mode == _MODE.FULL_DUPLEX_STREAMED

    def _refuse(self, resp: pb.ProcessingResponse) -> list[pb.ProcessingResponse]:
        self.is_done = True
        return [resp]

    def _too_large(self) -> list[pb.ProcessingResponse]:
        limit = self.picker.core.cfg.limits.max_body_bytes
        return self._refuse(gie.immediate(413, f"request body exceeds {limit} bytes",
                                          "body_too_large"))

    async def _request_headers(self, msg: pb.HttpHeaders) -> list[pb.ProcessingResponse]:
        self.headers = gie.header_map(msg)
        self.path = self.headers.get(":path", "").partition("?")[0]
        length = self.headers.get("content-length", "")
        if length.isdigit() and int(length) > self.picker.core.cfg.limits.max_body_bytes:
            return self._too_large()
        if msg.end_of_stream:
            if self.headers.get(":method", "") == "POST":
                return self._refuse(gie.immediate(
                    400, "request body is required", "missing_body"))
            return await self._pick(is_end=True, has_body=False)  # e.g. GET /v1/models
        if not self.is_supported_mode:
            return self._refuse(gie.immediate(
                500, "the gateway's ext_proc filter must use request_body_mode BUFFERED or "
                "FULL_DUPLEX_STREAMED for the kvfleet endpoint picker", "epp_misconfigured"))
        if self.is_full_duplex:
            return []  # answered once the body is in
        return [pb.ProcessingResponse(request_headers=gie.headers_continue())]

    async def _request_body(self, msg: pb.HttpBody) -> list[pb.ProcessingResponse]:
        self.body += msg.body
        if len(self.body) > self.picker.core.cfg.limits.max_body_bytes:
            return self._too_large()
        if self.is_full_duplex and not msg.end_of_stream:
            return []
        return await self._pick(is_end=msg.end_of_stream)

    async def _pick(self, is_end: bool, has_body: bool = True) -> list[pb.ProcessingResponse]:
        p = self.picker
        core, opts = p.core, p.opts
        try:
            info, policy = admit(core, bytes(self.body), self.path, self.headers) \
                if has_body else (RequestInfo(), None)
        except RequestError as exc:
            return self._refuse(_refusal(exc))
        if p.gate is not None:
            key_tenant = p.gate.tenant_of(self.headers.get("authorization"))
            got = p.gate.admit(info, key_tenant) if has_body and \
                not isinstance(key_tenant, web.Response) else key_tenant
            if isinstance(got, web.Response):
                return self._refuse(_gate_refusal(got))
        allowed = p.allowed(self.subset)
        if allowed is not None and not allowed:
            return self._refuse(gie.immediate(
                503, "no endpoint of the gateway's subset hint is in this pool", "no_endpoint"))
        try:
            routed = await p.dispatcher.acquire(info, opts.role, policy, frozenset(), allowed)
        except Rejected as rej:
            return self._refuse(_rejected(rej))
        e = routed.decision.endpoint
        assert e is not None
        self.routed, self.active, self.info = routed, e, info
        self.picked_at = time.monotonic()
        chosen = [e.name]
        addrs = [address(e.url)]
        if opts.num_fallbacks and p.dispatcher.follow_config().is_active:
            # the gateway's fallbacks keep the primary's revision (the split holds)
            same = frozenset(x.name for x in core.registry.endpoints if x.revision == e.revision)
            allowed = same if allowed is None else allowed & same
        for _ in range(opts.num_fallbacks):
            alt = core.route(info, opts.role, self.picked_at, policy, frozenset(chosen),
                             allowed).decision.endpoint
            if alt is None:
                break
            chosen.append(alt.name)
            addrs.append(address(alt.url))
        mutation, metadata = gie.pick_mutation(",".join(addrs))
        if p.gate is not None and p.gate.keys is not None:
            mutation.remove_headers.append("authorization")  # the key is the router's
        if not has_body:
            return [pb.ProcessingResponse(request_headers=gie.headers_continue(mutation),
                                          dynamic_metadata=metadata)]
        if self.is_full_duplex:
            return [pb.ProcessingResponse(request_headers=gie.headers_continue(mutation),
                                          dynamic_metadata=metadata),
                    *gie.streamed_bodies(bytes(self.body), is_end)]
        return [pb.ProcessingResponse(
            request_body=pb.BodyResponse(response=pb.CommonResponse(header_mutation=mutation)),
            dynamic_metadata=metadata)]

    # --- response side ---
    def _response_headers(self, req: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        headers = gie.header_map(req.response_headers)
        status = headers.get(":status", "")
        self.status = int(status) if status.isdigit() else 0
        served = gie.metadata_value(req.metadata_context, gie.LB_NAMESPACE, gie.SERVED) \
            if req.HasField("metadata_context") else None
        if not isinstance(served, str) or not served:
            served = headers.get(gie.SERVED)
        if self.active is not None:
            self.ttft_s = time.monotonic() - self.picked_at
            self._settle(served.split(",")[0].strip() if served else None)
        if self.active is not None and self.routed is not None:
            # the first byte, as far as the gateway shows it (its TTFT point above)
            self.picker.core.first_byte(self.routed)
        mutation = gie.strip_served() if gie.SERVED in headers else None
        if req.response_headers.end_of_stream:
            self._finish()
        return [pb.ProcessingResponse(response_headers=gie.headers_continue(mutation))]

    def _settle(self, served: str | None) -> None:
        """Who answered: the primary, a fallback, or the gateway itself."""
        p, e, routed = self.picker, self.active, self.routed
        assert e is not None and routed is not None
        now = time.monotonic()
        if served is None:
            kind = _GATEWAY_FAILURES.get(self.status)
            if kind is not None:  # no upstream answered: the gateway's own error reply
                self.is_gateway_failure = True
                p.feedback.failure(e, kind, now)
            return
        if served == address(e.url):
            return
        p.feedback.failure(e, "connect", now)  # the gateway moved on to a fallback
        p.dispatcher.end(routed)
        p.dispatcher.metrics.retries.inc()
        self.active = None
        alt = p.endpoint_at(served)
        if alt is None:
            return  # not ours (any more): nothing to count
        moved = Routed(Decision(alt, "fallback"), routed.ctx, routed.hashes, routed.policy_name)
        p.core.start(moved)
        p.feedback.attempt(alt, now)
        self.routed, self.active = moved, alt

    def _finish(self) -> None:
        e, routed = self.active, self.routed
        if e is None or routed is None:
            return
        self.active = None
        p = self.picker
        now = time.monotonic()
        counts = p.dispatcher.meter.of(e.revision)
        if counts is not None:  # the revision's measurements: TTFT to the response headers
            counts.record(is_error=self.is_gateway_failure or self.status >= 500)
            if self.ttft_s is not None and 0 < self.status < 400:
                counts.observe_ttft(self.ttft_s)
        if not self.is_gateway_failure:
            ttft = self.ttft_s if self.ttft_s is not None else now - self.picked_at
            outcome = Outcome(ttft, now - self.picked_at, 0, self.info.is_stream,
                              is_client_gone=self.status == 0,
                              is_client_fault=self.status >= 400)
            p.feedback.exchange_done(e, routed, outcome, now)
        p.dispatcher.end(routed)
