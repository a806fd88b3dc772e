"""The GIE Endpoint Picker protocol (v1.0.0, proposal 004) in ext_proc messages.

* The pick: request header `x-gateway-destination-endpoint` and dynamic metadata
  `envoy.lb` / `x-gateway-destination-endpoint`, the same value in both: `ip:port`, or a
  comma list (primary, then ordered fallbacks). The header overwrites any the client sent.
* Subset hint: request metadata `envoy.lb.subset_hint` /
  `x-gateway-destination-endpoint-subset` (a list of `ip:port`) limits the candidates.
* Served: `x-gateway-destination-endpoint-served` in the response metadata (`envoy.lb`) or
  as a response header (Envoy: `%UPSTREAM_REMOTE_ADDRESS%`); the header is stripped before
  the client sees it.
* Refusals: an ImmediateResponse, 503 when nothing can serve and 429 to shed load; bad
  requests get their 4xx. Every body is OpenAI's error JSON (errors.error_body).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

from kvfleet_router.errors import error_body

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
HEALTH_SERVICES = ("liveness", "readiness", EXT_PROC_SERVICE)
MAX_BODY_CHUNK = 1 << 20  # a body echoed back in full-duplex mode, per message

_OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def header_map(headers: pb.HttpHeaders) -> dict[str, str]:
    """Envoy sends lower-case keys; values in `raw_value` (or `value`, older Envoys)."""
    return {h.key: h.raw_value.decode("latin-1") if h.raw_value else h.value
            for h in headers.headers.headers}


def _set(key: str, value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key=key, raw_value=value.encode("latin-1")),
        append_action=_OVERWRITE)


def pick_mutation(endpoints: str) -> tuple[pb.HeaderMutation, struct_pb2.Struct]:
    """The header and the `envoy.lb` metadata naming the pick (the same comma list)."""
    metadata = struct_pb2.Struct()
    metadata.fields[LB_NAMESPACE].struct_value.fields[DESTINATION].string_value = endpoints
    return pb.HeaderMutation(set_headers=[_set(DESTINATION, endpoints)]), metadata


def headers_continue(mutation: pb.HeaderMutation | None = None) -> pb.HeadersResponse:
    return pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mutation)
                              if mutation is not None else None)


def strip_served() -> pb.HeaderMutation:
    return pb.HeaderMutation(remove_headers=[SERVED])


def streamed_bodies(body: bytes, is_end: bool) -> Iterable[pb.ProcessingResponse]:
    """A body handed back in full-duplex mode (the gateway forwards what we return)."""
    chunks = [body[i:i + MAX_BODY_CHUNK] for i in range(0, len(body), MAX_BODY_CHUNK)] or [b""]
    for i, chunk in enumerate(chunks):
        last = is_end and i == len(chunks) - 1
        mutation = pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(
            body=chunk, end_of_stream=last))
        yield pb.ProcessingResponse(request_body=pb.BodyResponse(
            response=pb.CommonResponse(body_mutation=mutation)))


def streamed_response_body(chunk: bytes, is_end: bool) -> pb.ProcessingResponse:
    mutation = pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(
        body=chunk, end_of_stream=is_end))
    return pb.ProcessingResponse(response_body=pb.BodyResponse(
        response=pb.CommonResponse(body_mutation=mutation)))


def immediate(status: int, message: str, code: str | None = None, param: str | None = None,
              headers: Mapping[str, str] | None = None) -> pb.ProcessingResponse:
    """An answer from the picker itself, in OpenAI's error shape; nothing goes upstream."""
    body = json.dumps(error_body(message, status, param, code)).encode()
    return immediate_raw(status, body, headers, code or str(status))


def immediate_raw(status: int, body: bytes, headers: Mapping[str, str] | None,
                  details: str) -> pb.ProcessingResponse:
    sets = [_set("content-type", "application/json")]
    sets += [_set(k.lower(), v) for k, v in (headers or {}).items()]
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),  # type: ignore[arg-type]
        headers=pb.HeaderMutation(set_headers=sets), body=body,
        details=f"kvfleet_epp_{details}"))


def metadata_value(md: object, namespace: str, key: str) -> object:
    """A value from a request's `metadata_context.filter_metadata` (None when absent)."""
    fm = getattr(md, "filter_metadata", None)
    if fm is None or namespace not in fm:
        return None
    fields = fm[namespace].fields
    if key not in fields:
        return None
    value = fields[key]
    kind = value.WhichOneof("kind")
    if kind == "string_value":
        return value.string_value
    if kind == "list_value":
        return [v.string_value for v in value.list_value.values
                if v.WhichOneof("kind") == "string_value"]
    return None
