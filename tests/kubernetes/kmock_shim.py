"""The operator tests' harness around kmock: kvfleet's kopf operator in-process, polling.

The shim that makes kmock real enough (`KubeShim`) and `api` live in the bench toolkit
(kvfleet_bench.kmock_shim), which bench/operator_scale.py runs too; they are re-exported
here for the tests.

`Operator` runs `kopf.operator()` with kvfleet's handlers as an asyncio task against it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import kopf
from kubernetes.aio import client as kclient
from kvfleet_bench.kmock_shim import KubeShim, api, write_kubeconfig
from kvfleet_operator.runtimes.kubernetes import handlers
from kvfleet_operator.runtimes.kubernetes.operator_config import OperatorConfig
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import KubeClient

__all__ = ["KubeShim", "Operator", "api", "eventually", "operator_running", "write_kubeconfig"]


class Operator:
    """kvfleet's kopf operator as an asyncio task against `url`."""

    def __init__(self, url: str, config: OperatorConfig | None = None,
                 extra: Callable[[kopf.OperatorRegistry], None] | None = None) -> None:  # fmt: skip
        self.url = url.rstrip("/")
        self.config = config or OperatorConfig(max_tick_s=0.3, retry_delay_s=0.3)
        self.extra = extra
        self.task: asyncio.Task[None] | None = None
        self.stop_flag = asyncio.Event()
        self.client: KubeClient | None = None

    async def start(self) -> Operator:
        url = self.url

        def login(**_: Any) -> kopf.ConnectionInfo:
            return kopf.ConnectionInfo(server=url, insecure=True)

        registry = handlers.register(kopf.OperatorRegistry(), login=login)
        if self.extra is not None:
            self.extra(registry)
        self.client = KubeClient(kclient.Configuration(host=url))
        memo = kopf.Memo(client=self.client, config=self.config)
        self.stop_flag = asyncio.Event()
        self.task = asyncio.create_task(kopf.operator(
            registry=registry, clusterwide=True, standalone=True, stop_flag=self.stop_flag,
            memo=memo))  # fmt: skip
        return self

    async def stop(self) -> None:
        self.stop_flag.set()
        if self.task is not None:
            try:
                await asyncio.wait_for(self.task, 20)
            finally:
                self.task = None
        if self.client is not None:
            await self.client.close()

    async def kill(self) -> None:
        """Gone at once, mid-whatever, as a crashed pod would be."""
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
            self.task = None
        if self.client is not None:
            await self.client.close()


@contextlib.asynccontextmanager
async def operator_running(url: str, config: OperatorConfig | None = None
                           ) -> AsyncIterator[Operator]:  # fmt: skip
    operator = await Operator(url, config).start()
    try:
        yield operator
    finally:
        await operator.stop()


async def eventually(check: Callable[[], Any], timeout_s: float = 15.0, what: str = "") -> Any:
    """Poll `check` until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what or check}")
        await asyncio.sleep(0.05)

