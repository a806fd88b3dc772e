"""What travels between engines and their readers: metric names, KV events, P/D fields.

Names follow vLLM v1 so that readers treat vLLM pods and kvfleet engines alike.
Import it as `kvfleet_engine.contract`, which re-exports everything here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = [
    "BUILTIN_MODELS",
    "BUILTIN_PROFILES",
    "OWNED_ENGINE_FLAGS",
    "CACHE_CONFIG_INFO",
    "DO_REMOTE_DECODE",
    "DO_REMOTE_PREFILL",
    "DRAINING",
    "E2E_REQUEST_LATENCY",
    "ENGINE_TOKEN_ENV",
    "GENERATION_TOKENS",
    "INTER_TOKEN_LATENCY",
    "KVEvent",
    "KVEventType",
    "KV_CACHE_USAGE_PERC",
    "KV_TRANSFER_PARAMS",
    "REQUEST_TIME_PER_OUTPUT_TOKEN",
    "LEGACY_NAMES",
    "MODEL_LABEL",
    "NUM_PREEMPTIONS",
    "NUM_REQUESTS_RUNNING",
    "NUM_REQUESTS_WAITING",
    "NUM_WAITING_PROMPT_TOKENS",
    "PREFIX_CACHE_HITS",
    "PREFIX_CACHE_QUERIES",
    "PROMPT_TOKENS",
    "REMOTE_BLOCK_IDS",
    "REMOTE_HANDLE",
    "REMOTE_HOST",
    "REMOTE_PORT",
    "REQUEST_QUEUE_TIME",
    "ROLES",
    "ROLE_INFO",
    "TIME_TO_FIRST_TOKEN",
]

# --- Prometheus metric names (vLLM v1). Counters are exposed with a `_total` suffix. ---
NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE_PERC = "vllm:kv_cache_usage_perc"  # a 0-1 fraction, despite the name
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"  # counter, in tokens
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"  # counter, in tokens
NUM_PREEMPTIONS = "vllm:num_preemptions"  # counter
PROMPT_TOKENS = "vllm:prompt_tokens"  # counter
GENERATION_TOKENS = "vllm:generation_tokens"  # counter
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"  # histogram
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"  # histogram, one sample per gap
# histogram, one sample per finished request: its mean time per output token after the
# first, (last token - first token) / (output tokens - 1), 0 for a one-token answer
REQUEST_TIME_PER_OUTPUT_TOKEN = "vllm:request_time_per_output_token_seconds"
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"  # histogram
REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"  # histogram
CACHE_CONFIG_INFO = "vllm:cache_config_info"  # gauge 1 with labels block_size, num_gpu_blocks

# kvfleet-only figures.
NUM_WAITING_PROMPT_TOKENS = "kvfleet:num_waiting_prompt_tokens"  # uncached prompt tokens queued
ROLE_INFO = "kvfleet:role"  # gauge 1 with label role=unified|prefill|decode
DRAINING = "kvfleet:draining"  # gauge 0/1

# Older vLLM names that readers must still accept, mapped to the current ones.
LEGACY_NAMES = {
    "vllm:gpu_cache_usage_perc": KV_CACHE_USAGE_PERC,
    "vllm:time_per_output_token_seconds": INTER_TOKEN_LATENCY,
    "vllm:gpu_prefix_cache_queries": PREFIX_CACHE_QUERIES,
    "vllm:gpu_prefix_cache_hits": PREFIX_CACHE_HITS,
}

MODEL_LABEL = "model_name"
# When set in an engine's environment, /v1/kv_events and /v1/kv_transfer/* need it as a
# bearer token (KV events carry prompt token ids). Readers send the same variable's value.
ENGINE_TOKEN_ENV = "KVFLEET_ENGINE_TOKEN"

ROLES = ("unified", "prefill", "decode")

# What a builtin engine can serve by name (`--model NAME`, the pool's builtin://NAME with the
# torch runner) and the cost profiles its simulated runner ships (`--profile NAME`), so the
# operator can reject a pool up front. Tests keep both equal to the engine's registries.
BUILTIN_MODELS = ("smollm2-135m", "tiny-random")
BUILTIN_PROFILES = ("cpu-tiny", "h100-llama3-8b")
# Arguments the control plane sets on every engine; a pool's engine.args must not.
OWNED_ENGINE_FLAGS = ("--host", "--port")

# --- KV events, streamed as NDJSON from GET /v1/kv_events ---
KVEventType = Literal["BlockStored", "BlockRemoved", "AllBlocksCleared"]


@dataclass(slots=True)
class KVEvent:
    """One change to an engine's prefix cache.

    `seq` increases by one per event on a given engine, so a reader detects gaps and
    resynchronises. `block_hashes` are the engine's chained block hashes (ints).
    `token_ids` (BlockStored only) lets a precise index verify or re-hash blocks.
    """

    seq: int
    type: KVEventType
    block_hashes: list[int]
    parent_block_hash: int | None = None
    token_ids: list[int] = field(default_factory=list)
    block_size: int = 0
    medium: str = "cpu"
    timestamp: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KVEvent:
        return cls(
            seq=int(data["seq"]),
            type=data["type"],
            block_hashes=[int(h) for h in data.get("block_hashes", [])],
            parent_block_hash=data.get("parent_block_hash"),
            token_ids=[int(t) for t in data.get("token_ids", [])],
            block_size=int(data.get("block_size", 0)),
            medium=str(data.get("medium", "cpu")),
            timestamp=float(data.get("timestamp", 0.0)),
        )


# --- Prefill/decode disaggregation: vLLM NixlConnector-style kv_transfer_params keys ---
KV_TRANSFER_PARAMS = "kv_transfer_params"
DO_REMOTE_DECODE = "do_remote_decode"
DO_REMOTE_PREFILL = "do_remote_prefill"
REMOTE_HOST = "remote_host"
REMOTE_PORT = "remote_port"
REMOTE_HANDLE = "remote_handle"
REMOTE_BLOCK_IDS = "remote_block_ids"
