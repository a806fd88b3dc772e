"""A raw ext_proc client: streams as a gateway would send them, for the picker's tests.

    async with ExtProcClient(port, tls) as c:
        out = await c.exchange(completion_headers(), body=b'{...}')   # BUFFERED mode
        out.pick       # "ip:port[,ip:port...]" from the header mutation, or None
        out.immediate  # (status, parsed JSON body, headers) when the picker refused
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import json_format, struct_pb2

MODE = processing_mode_pb2.ProcessingMode
DEST = "x-gateway-destination-endpoint"


def headers_msg(headers: dict[str, str], end: bool = False, mode: int = MODE.BUFFERED,
                response_mode: int = MODE.NONE,
                metadata: dict[str, Any] | None = None) -> pb.ProcessingRequest:
    req = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]),
            end_of_stream=end),
        protocol_config=pb.ProtocolConfiguration(request_body_mode=mode,
                                                 response_body_mode=response_mode))
    if metadata:
        for ns, value in metadata.items():
            s = struct_pb2.Struct()
            s.update(value)
            req.metadata_context.filter_metadata[ns].CopyFrom(s)
    return req


def completion_headers(path: str = "/v1/completions", **extra: str) -> dict[str, str]:
    return {":method": "POST", ":path": path, ":authority": "gateway", ":scheme": "http",
            "content-type": "application/json", **extra}


def body_msg(body: bytes, end: bool = True) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=end))


def response_headers_msg(status: int, served: str | None = None) -> pb.ProcessingRequest:
    hs = [base_pb2.HeaderValue(key=":status", raw_value=str(status).encode())]
    if served:
        hs.append(base_pb2.HeaderValue(key="x-gateway-destination-endpoint-served",
                                       raw_value=served.encode()))
    return pb.ProcessingRequest(response_headers=pb.HttpHeaders(
        headers=base_pb2.HeaderMap(headers=hs)))


@dataclass
class Result:
    responses: list[pb.ProcessingResponse] = field(default_factory=list)

    @property
    def immediate(self) -> tuple[int, Any, dict[str, str]] | None:
        for r in self.responses:
            if r.HasField("immediate_response"):
                ir = r.immediate_response
                hs = {h.header.key: h.header.raw_value.decode() for h in ir.headers.set_headers}
                return int(ir.status.code), json.loads(ir.body), hs
        return None

    @property
    def pick(self) -> str | None:
        for r in self.responses:
            for common in (r.request_body.response, r.request_headers.response):
                for h in common.header_mutation.set_headers:
                    if h.header.key == DEST:
                        return h.header.raw_value.decode()
        return None

    @property
    def metadata(self) -> dict[str, Any]:
        for r in self.responses:
            if r.HasField("dynamic_metadata"):
                return json_format.MessageToDict(r.dynamic_metadata)
        return {}

    def kinds(self) -> list[str]:
        return [str(r.WhichOneof("response")) for r in self.responses]


class ExtProcClient:
    def __init__(self, port: int, cert_pem: bytes | None = None) -> None:
        target = f"127.0.0.1:{port}"
        if cert_pem is None:
            self.channel = grpc.aio.insecure_channel(target)
        else:
            self.channel = grpc.aio.secure_channel(
                target, grpc.ssl_channel_credentials(root_certificates=cert_pem))
        self.stub = pb_grpc.ExternalProcessorStub(self.channel)

    async def __aenter__(self) -> ExtProcClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close()

    def open(self) -> Any:
        return self.stub.Process()

    async def send(self, call: Any, messages: list[pb.ProcessingRequest],
                   num_replies: list[int]) -> Result:
        """Write each message, then read `num_replies[i]` replies (or up to an immediate)."""
        out = Result()
        for msg, n in zip(messages, num_replies, strict=True):
            await call.write(msg)
            for _ in range(n):
                resp = await call.read()
                if resp is grpc.aio.EOF:
                    return out
                out.responses.append(resp)
                if resp.HasField("immediate_response"):
                    return out
        return out

    async def exchange(self, headers: dict[str, str], body: bytes | None,
                       metadata: dict[str, Any] | None = None) -> Result:
        """One BUFFERED request: headers (-> CONTINUE), body (-> the pick); then close."""
        call = self.open()
        if body is None:
            out = await self.send(call, [headers_msg(headers, end=True, metadata=metadata)],
                                  [1])
        else:
            out = await self.send(call, [headers_msg(headers, metadata=metadata),
                                         body_msg(body)], [1, 1])
        await call.done_writing()
        return out
