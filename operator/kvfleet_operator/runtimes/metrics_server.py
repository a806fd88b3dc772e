"""Serve the control plane's metrics (`loop.metrics.LoopMetrics`) on loopback for Prometheus."""

from __future__ import annotations

from typing import Protocol

from aiohttp import web

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Renders(Protocol):
    """`loop.metrics.LoopMetrics`, or the operator's metrics of every pool."""

    def render(self) -> bytes: ...


async def start(metrics: Renders, host: str, port: int) -> tuple[web.AppRunner, int]:
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
