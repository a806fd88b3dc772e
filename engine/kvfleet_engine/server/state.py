"""What one server process shares between its handlers: settings, streams, counters.

Everything here lives on the event loop; the engine itself is reached only through
`EngineThread`. Outputs arrive from that thread in batches and are routed to the
per-request queue of the handler waiting for them.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from kvfleet_engine.contract import ROLES
from kvfleet_engine.contract.http_limits import (
    DEFAULT_BODY_READ_TIMEOUT_S,
    DEFAULT_ENGINE_MAX_UPLOADS_PER_CLIENT,
    UploadSlots,
)
from kvfleet_engine.server.drain import DrainState
from kvfleet_engine.server.errors import OVERLOADED, SERVER_ERROR, APIError


@dataclass(slots=True)
class ServerSettings:
    served_model_names: list[str]
    max_model_len: int
    vocab_size: int
    block_size: int = 16
    role: str = "unified"
    host: str = "127.0.0.1"
    port: int = 8000
    advertise_host: str = ""  # what decoders dial for KV (remote_host); "" means `host`
    max_num_seqs: int = 64
    max_queue: int = 256  # requests beyond the running batch before 503
    max_body_bytes: int = 1 << 20
    body_read_timeout_s: float = DEFAULT_BODY_READ_TIMEOUT_S  # a whole body must arrive within
    # unfinished bodies per client address (a router in front is one address)
    max_uploads_per_client: int = DEFAULT_ENGINE_MAX_UPLOADS_PER_CLIENT
    drain_timeout_s: float = 30.0
    kv_handle_ttl_s: float = 60.0
    kv_transfer_timeout_s: float = 30.0
    peer_fetch_timeout_s: float = 5.0  # a peer-prefix fetch slower than this is recomputed
    kv_export_max_bytes: int = 256 << 20  # KV payload one peer export may answer with
    enable_prefix_caching: bool = True
    retry_after_s: int = 1
    fault_error_rate: float = 0.0  # a share of completions answered 500 (rollback rehearsals)
    engine_id: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    # bearer token for the fleet-internal endpoints (KV events, KV transfer); "" = open
    internal_token: str = field(default="", repr=False)

    def __post_init__(self) -> None:
        if not self.served_model_names or not all(self.served_model_names):
            raise ValueError("at least one non-empty served model name is required")
        if self.role not in ROLES:
            raise ValueError(f"role must be one of {', '.join(ROLES)}")
        for name in ("max_model_len", "vocab_size", "block_size", "max_num_seqs", "max_body_bytes",
                     "max_uploads_per_client", "kv_export_max_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1")
        if self.max_queue < 0:
            raise ValueError("max_queue must be >= 0")
        for name in ("kv_handle_ttl_s", "kv_transfer_timeout_s", "body_read_timeout_s",
                     "peer_fetch_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive")
        if self.drain_timeout_s < 0:
            raise ValueError("drain_timeout_s must be >= 0")

    @property
    def remote_host(self) -> str:
        return self.advertise_host or self.host

    @property
    def num_admissible(self) -> int:
        """Requests in flight at most: the running batch plus the queue."""
        return self.max_num_seqs + self.max_queue


class RequestStream:
    """The loop-side mailbox of one request: outputs or an error, in order."""

    __slots__ = ("queue",)

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Any] = asyncio.Queue()


class ServerState:
    def __init__(self, settings: ServerSettings, tokenizer: Any) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.drain = DrainState(settings.drain_timeout_s)
        self.streams: dict[str, RequestStream] = {}
        self.uploads = UploadSlots(settings.max_uploads_per_client)
        self.num_busy_transfers = 0  # KV pulls being served to decoders and peers
        self.is_engine_crashed = False  # set by the watchdog; the process then exits 1
        # set at startup, once the loop exists
        self.engine: Any = None  # EngineThread
        self.metrics: Any = None  # ServerMetrics
        self.kv_events: Any = None  # KVEventHub
        self.handles: Any = None  # kv_transfer.HandleStore
        self.peer_session: Any = None  # aiohttp.ClientSession for peer-prefix fetches
        self.kv_block_shape: tuple[str, list[int]] = ("", [])  # runner.kv_block_shape()
        self.num_fault_candidates = 0  # completions seen by the fault injector

    @property
    def num_in_flight(self) -> int:
        """Work that a drain waits for: live requests, KV held for decoders, pulls."""
        num_handles = len(self.handles) if self.handles is not None else 0
        return len(self.streams) + num_handles + self.num_busy_transfers

    def inject_fault(self) -> None:
        """--fault-error-rate: request n fails when the running share of failures would fall
        below the rate without it, so failures are evenly spread and exact over any run."""
        rate = self.settings.fault_error_rate
        if rate <= 0:
            return
        n = self.num_fault_candidates
        self.num_fault_candidates += 1
        if int((n + 1) * rate) > int(n * rate):
            raise APIError(500, "injected fault (--fault-error-rate)", type=SERVER_ERROR,
                           code="injected_fault")

    def check_admission(self) -> None:
        if self.engine is not None and not self.engine.is_alive:
            raise APIError(503, "the engine has stopped; this replica is shutting down",
                           type=SERVER_ERROR, code="engine_stopped")
        if not self.drain.is_admitting:
            raise APIError(503, "this replica is draining; retry on another one",
                           type=OVERLOADED, code="draining",
                           headers={"Retry-After": str(self.settings.retry_after_s)})
        if len(self.streams) >= self.settings.num_admissible:
            raise APIError(
                503,
                f"the server is overloaded ({len(self.streams)} requests in flight); retry later",
                type=OVERLOADED,
                code="queue_full",
                headers={"Retry-After": str(self.settings.retry_after_s)},
            )

    def open_stream(self, request_id: str) -> RequestStream:
        stream = RequestStream()
        self.streams[request_id] = stream
        return stream

    def close_stream(self, request_id: str) -> None:
        self.streams.pop(request_id, None)

    # called on the loop by EngineThread
    def deliver_outputs(self, outputs: list[Any]) -> None:
        for output in outputs:
            stream = self.streams.get(output.request_id)
            if stream is not None:
                stream.queue.put_nowait(output)

    def deliver_error(self, request_id: str, exc: BaseException) -> None:
        stream = self.streams.get(request_id)
        if stream is not None:
            stream.queue.put_nowait(exc)


STATE_KEY = web.AppKey("kvfleet_state", ServerState)
