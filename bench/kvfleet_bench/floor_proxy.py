"""The floor under any aiohttp router: aiohttp's server on uvloop and the router's own
upstream client (kvfleet_router.upstream), backends in turn, nothing else.

No routing state, admission, quotas, metrics, timeouts or accounting: the least CPU a
request costs on the stack issue 29 keeps (aiohttp as the server). bench/router_overhead.py
measures it beside the routers as the target `aiohttp-floor`, so a CPU target for kvfleet
can be read against what the stack alone spends. Streams are relayed chunk by chunk, the
last chunk and the end in one write, as kvfleet's Forwarder does.

    python -m kvfleet_bench.floor_proxy --port 8000 http://127.0.0.1:9001 http://...
"""

from __future__ import annotations

import argparse
import itertools

import uvloop
from aiohttp import web
from kvfleet_router.upstream import UpstreamPool

CONNECT_S = 5.0
IDLE_S = 60.0


def make_app(backends: list[str]) -> web.Application:
    pool = UpstreamPool()
    turn = itertools.cycle(backends)

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        resp = await pool.post(next(turn), request.path, body,
                               (("Content-Type", "application/json"),), CONNECT_S, IDLE_S)
        out = web.StreamResponse(status=resp.status,
                                 headers={"Content-Type": resp.content_type})
        await out.prepare(request)
        content = resp.content
        while data := await content.readany():
            if content.at_eof():
                await out.write_eof(data)  # the last bytes and the end, one write
                break
            await out.write(data)
        else:
            await out.write_eof()
        resp.release()
        return out

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def close_pool(app: web.Application) -> None:
        await pool.close()

    app = web.Application()
    app.router.add_post("/v1/completions", forward)
    app.router.add_post("/v1/chat/completions", forward)
    app.router.add_get("/health", health)
    app.on_cleanup.append(close_pool)
    return app


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("backends", nargs="+", help="backend base URLs")
    args = p.parse_args(argv)
    web.run_app(make_app(args.backends), host=args.host, port=args.port,
                loop=uvloop.new_event_loop(), print=None, access_log=None)


if __name__ == "__main__":
    main()
