"""The engine's public contract: the only part of the engine the router and operator import.

- `wire`: metric names (vLLM v1, legacy names mapped), the KV-event shape, P/D field names;
- `metrics_text`: the one `/metrics` reader (its docstring states the parsing rules);
- `peer_prefix`: the peer-prefix hint in `kv_transfer_params` and its metric names;
- `kv_fetch_decision`: the pure fetch-vs-recompute estimate;
- `chat_template`: chat messages rendered with the model's template (imported as a module).

Both are re-exported here, so readers write `from kvfleet_engine import contract` and
`contract.read_gauges(text)`. Neither imports torch, aiohttp or the rest of the engine.
"""

from __future__ import annotations

from kvfleet_engine.contract.metrics_text import (
    CORE_GAUGES,
    COUNTERS,
    GAUGES,
    HISTOGRAMS,
    Buckets,
    EngineMetrics,
    MetricSample,
    ParsedText,
    parse_text,
    read_gauges,
    read_metrics,
)
from kvfleet_engine.contract.peer_prefix import (
    PEER_PREFIX,
    PeerPrefix,
    PeerPrefixError,
    parse_peer_prefix,
    peer_prefix_hint,
)
from kvfleet_engine.contract.wire import *  # noqa: F403
from kvfleet_engine.contract.wire import __all__ as _wire_all

__all__ = [
    *_wire_all,
    "COUNTERS",
    "CORE_GAUGES",
    "GAUGES",
    "HISTOGRAMS",
    "PEER_PREFIX",
    "Buckets",
    "EngineMetrics",
    "MetricSample",
    "ParsedText",
    "PeerPrefix",
    "PeerPrefixError",
    "parse_peer_prefix",
    "parse_text",
    "peer_prefix_hint",
    "read_gauges",
    "read_metrics",
]
