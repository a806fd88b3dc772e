"""A no-op ext_proc server on grpcio's asyncio API: the floor under any Python endpoint picker.

It answers the three messages of a BUFFERED stream (request headers: CONTINUE; body: a
round-robin pick over the backends, as header and `envoy.lb` metadata; response headers:
CONTINUE) without parsing or scoring anything, over the same TLS as kvfleet's picker.
bench/epp_overhead.py runs it behind the same Envoy as target `floor`, so the picker's own
cost is the difference.

    python bench/epp_floor.py --port 9002 --backend 127.0.0.1:8001 --backend 127.0.0.1:8002
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import sys

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from kvfleet_router.epp import protocol as gie
from kvfleet_router.epp.tls import self_signed

CONTINUE_HEADERS = pb.ProcessingResponse(request_headers=pb.HeadersResponse())
CONTINUE_RESPONSE = pb.ProcessingResponse(response_headers=pb.HeadersResponse())


class Floor(pb_grpc.ExternalProcessorServicer):
    def __init__(self, backends: list[str]) -> None:
        picks = []
        for b in backends:
            mutation, metadata = gie.pick_mutation(b)
            picks.append(pb.ProcessingResponse(
                request_body=pb.BodyResponse(response=pb.CommonResponse(
                    header_mutation=mutation)), dynamic_metadata=metadata))
        self.picks = itertools.cycle(picks)

    async def Process(self, request_iterator, context):  # noqa: N802
        async for req in request_iterator:
            kind = req.WhichOneof("request")
            if kind == "request_headers":
                yield CONTINUE_HEADERS
            elif kind == "request_body":
                yield next(self.picks)
            elif kind == "response_headers":
                yield CONTINUE_RESPONSE


async def serve(port: int, backends: list[str]) -> None:
    server = grpc.aio.server()
    pb_grpc.add_ExternalProcessorServicer_to_server(Floor(backends), server)
    cert, key = self_signed()
    server.add_secure_port(f"127.0.0.1:{port}", grpc.ssl_server_credentials([(key, cert)]))
    await server.start()
    print(f"ext_proc floor on 127.0.0.1:{port}", flush=True)
    await server.wait_for_termination()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--backend", action="append", required=True, help="ip:port")
    args = p.parse_args()
    try:
        import uvloop

        uvloop.run(serve(args.port, args.backend))
    except ImportError:
        asyncio.run(serve(args.port, args.backend))
    return 0


if __name__ == "__main__":
    sys.exit(main())
