"""kvfleet_engine: a continuous-batching LLM engine, in three rooms.

- `core/`: requests, block pool and KV cache, scheduler, the step loop (no torch, no aiohttp);
- `runners/` and `model/`: the torch and simulated runners, cost profiles, the Llama family;
- `server/`: the OpenAI-compatible aiohttp server, /metrics, KV events, KV transfer, P/D.

`contract` is what the router and operator may import. The offline API is exported here,
as in vLLM (`from kvfleet_engine import LLM, SamplingParams`; `LLM.generate` returns
vLLM-shaped `RequestOutput`s holding `CompletionOutput`s), and loaded on first use,
so `import kvfleet_engine.contract` pulls in nothing else.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvfleet_engine.core.config import EngineConfig
    from kvfleet_engine.core.sampling_params import SamplingParams
    from kvfleet_engine.llm import LLM, CompletionOutput, RequestOutput

_EXPORTS = {
    "LLM": "kvfleet_engine.llm",
    "SamplingParams": "kvfleet_engine.core.sampling_params",
    "RequestOutput": "kvfleet_engine.llm",  # the offline API's (the engine's step output
    "CompletionOutput": "kvfleet_engine.llm",  # is kvfleet_engine.core.outputs.RequestOutput)
    "EngineConfig": "kvfleet_engine.core.config",
}

__all__ = ["LLM", "CompletionOutput", "EngineConfig", "RequestOutput", "SamplingParams"]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'kvfleet_engine' has no attribute {name!r}")
    value = getattr(import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
