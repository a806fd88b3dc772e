"""Serve the control plane's metrics (`loop.metrics.LoopMetrics`) on loopback for Prometheus."""

from __future__ import annotations

from aiohttp import web

from kvfleet_operator.loop.metrics import LoopMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


async def start(metrics: LoopMetrics, host: str, port: int) -> tuple[web.AppRunner, int]:
    """Start serving GET /metrics; returns the runner (cleanup stops it) and the bound port."""

    async def handle(_request: web.Request) -> web.Response:
        return web.Response(body=metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, int(runner.addresses[0][1])
