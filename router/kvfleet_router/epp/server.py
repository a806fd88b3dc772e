"""The Endpoint Picker's gRPC server: `envoy.service.ext_proc.v3.ExternalProcessor/Process`
plus gRPC health (`liveness`, `readiness`, the ext_proc service name, and "").

    server = EppServer(picker, opts)
    port = await server.start()        # TLS unless opts.is_insecure; raises OSError
    server.set_ready(True)             # readiness follows the config (app.py wires it)
    await server.stop()

Each stream runs one `Exchange`. Whatever goes wrong inside one (a bug included) ends
that stream with an ImmediateResponse 500 in OpenAI's shape; the server and every other
stream carry on.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvfleet_router.config import MAX_BODY_BYTES_CEILING

from . import protocol as gie
from .exchange import Exchange, Picker
from .options import EppOptions
from .tls import self_signed

log = logging.getLogger(__name__)
_MAX_MESSAGE = MAX_BODY_BYTES_CEILING + (1 << 20)
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _Processor(pb_grpc.ExternalProcessorServicer):
    def __init__(self, picker: Picker) -> None:
        self.picker = picker

    async def Process(self, request_iterator: AsyncIterator[pb.ProcessingRequest],  # noqa: N802
                      context: grpc.aio.ServicerContext) -> AsyncIterator[pb.ProcessingResponse]:
        ex = Exchange(self.picker)
        try:
            async for req in request_iterator:
                try:
                    out = await ex.handle(req)
                except Exception:
                    log.exception("endpoint picker stream failed")
                    yield gie.immediate(500, "internal endpoint picker error", "internal_error")
                    return
                for resp in out:
                    yield resp
                if ex.is_done:
                    return
        finally:
            ex.close()


def _credentials(opts: EppOptions) -> grpc.ServerCredentials:
    if opts.cert_file and opts.key_file:
        try:
            with open(opts.cert_file, "rb") as c, open(opts.key_file, "rb") as k:
                cert, key = c.read(), k.read()
        except OSError as exc:
            raise OSError(f"endpoint picker: cannot read {exc.filename}: {exc.strerror}"
                          ) from None
    else:
        cert, key = self_signed()
    return grpc.ssl_server_credentials([(key, cert)])


class EppServer:
    def __init__(self, picker: Picker, opts: EppOptions) -> None:
        self.opts = opts
        self._server = grpc.aio.server(options=[
            ("grpc.max_receive_message_length", _MAX_MESSAGE),
            ("grpc.max_send_message_length", _MAX_MESSAGE),
            ("grpc.so_reuseport", 0)])
        pb_grpc.add_ExternalProcessorServicer_to_server(_Processor(picker), self._server)
        self._health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)

    async def start(self) -> int:
        opts = self.opts
        target = f"[{opts.host}]:{opts.port}" if ":" in opts.host else f"{opts.host}:{opts.port}"
        try:
            if opts.is_insecure:
                port = self._server.add_insecure_port(target)
            else:
                port = self._server.add_secure_port(target, _credentials(opts))
        except RuntimeError:  # grpcio raises rather than returning 0 on a bind failure
            port = 0
        if not port:
            raise OSError(f"cannot listen on {target} (endpoint picker)")
        await self._server.start()
        for name in ("", "liveness", gie.EXT_PROC_SERVICE):
            await self._health.set(name, _SERVING)
        await self._health.set("readiness", _NOT_SERVING)
        return port

    async def set_ready(self, is_ready: bool) -> None:
        await self._health.set("readiness", _SERVING if is_ready else _NOT_SERVING)

    async def stop(self, grace_s: float = 5.0) -> None:
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_s)
