"""Prefill -> decode KV hand-off: the wire frame and held-KV handles (the HTTP pull is
`server.kv_fetch`). A peer's prefix export (`core.prefix_share`) uses the same frame,
with `block_hashes` and `model` filled in.

Frame (one HTTP body): b"KVT1" | u32 big-endian header length | JSON header | raw bytes.
The header names dtype and per-block shape (what `Runner.kv_block_shape` reports), the
prompt tokens the KV covers, and a SHA-256 of the payload, so a decoder can refuse KV
that does not fit its cache, belongs to another prompt, or arrived damaged.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import struct
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

MAGIC = b"KVT1"
_LEN = struct.Struct(">I")
MAX_HEADER_BYTES = 16 << 20


class KVTransferError(Exception):
    """The KV could not be fetched or did not check out; `is_timeout` for slow peers,
    `status` for a peer that answered with a non-200 HTTP status, `is_unreachable` when
    no answer came (unknown host, refused, reset)."""

    def __init__(self, message: str, *, is_timeout: bool = False, status: int | None = None,
                 is_unreachable: bool = False) -> None:
        super().__init__(message)
        self.is_timeout = is_timeout
        self.status = status
        self.is_unreachable = is_unreachable


@dataclass(slots=True)
class KVHeader:
    dtype: str
    block_shape: list[int]  # shape of one block's bytes as read_blocks lays them out
    num_blocks: int
    num_tokens: int  # prompt tokens whose KV the blocks hold
    token_ids: list[int]
    block_size: int
    checksum: str  # sha256 hex of the payload
    nbytes: int
    engine_id: str = ""
    block_hashes: list[int] = field(default_factory=list)  # peer export: each block's hash
    model: str = ""  # the served model name of the replica that computed the KV

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def pack_frame(header: KVHeader, payload: bytes) -> bytes:
    encoded = json.dumps(header.to_dict(), separators=(",", ":")).encode()
    return MAGIC + _LEN.pack(len(encoded)) + encoded + payload


def make_header(*, dtype: str, block_shape: list[int], num_blocks: int, token_ids: list[int],
                block_size: int, payload: bytes, engine_id: str = "",
                block_hashes: list[int] | None = None, model: str = "") -> KVHeader:
    return KVHeader(
        dtype=dtype, block_shape=list(block_shape), num_blocks=num_blocks,
        num_tokens=len(token_ids), token_ids=list(token_ids), block_size=block_size,
        checksum=hashlib.sha256(payload).hexdigest(), nbytes=len(payload), engine_id=engine_id,
        block_hashes=list(block_hashes or []), model=model,
    )


def unpack_frame(frame: bytes) -> tuple[KVHeader, bytes]:
    """Header and payload of a frame; KVTransferError if it is cut short or damaged."""
    if len(frame) < len(MAGIC) + _LEN.size or not frame.startswith(MAGIC):
        raise KVTransferError("not a KV transfer frame (bad magic)")
    (header_len,) = _LEN.unpack_from(frame, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    if header_len > MAX_HEADER_BYTES or start + header_len > len(frame):
        raise KVTransferError("KV transfer frame truncated in its header")
    try:
        raw = json.loads(frame[start:start + header_len])
        header = KVHeader(**raw)
    except (ValueError, TypeError) as exc:
        raise KVTransferError(f"bad KV transfer header: {exc}") from None
    payload = frame[start + header_len:]
    if len(payload) != header.nbytes:
        raise KVTransferError(f"KV payload truncated: {len(payload)} of {header.nbytes} bytes")
    if hashlib.sha256(payload).hexdigest() != header.checksum:
        raise KVTransferError("KV payload checksum mismatch")
    expected = header.num_blocks * math.prod(header.block_shape) * _dtype_bytes(header.dtype)
    if expected != header.nbytes:
        raise KVTransferError(
            f"KV payload is {header.nbytes} bytes, but {header.num_blocks} blocks of "
            f"{header.dtype}{header.block_shape} make {expected}"
        )
    return header, payload


def check_compatible(header: KVHeader, *, dtype: str, block_shape: list[int], block_size: int,
                     token_ids: list[int]) -> None:
    """Raise unless this KV fits the local cache and belongs to this prompt."""
    if header.dtype != dtype or list(header.block_shape) != list(block_shape):
        raise KVTransferError(
            f"remote KV is {header.dtype}{header.block_shape}, this cache is {dtype}{block_shape}"
        )
    if header.block_size != block_size:
        raise KVTransferError(f"remote block size {header.block_size} != local {block_size}")
    if header.num_tokens > len(token_ids) or token_ids[:header.num_tokens] != header.token_ids:
        raise KVTransferError("remote KV was computed for a different prompt")
    if header.num_blocks != math.ceil(header.num_tokens / block_size):
        raise KVTransferError("remote KV block count does not match its token count")


_DTYPE_BYTES = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "uint64": 8, "int32": 4, "uint32": 4, "int16": 2, "int8": 1, "uint8": 1,
}  # the simulated runner's pseudo-KV is uint64


def _dtype_bytes(dtype: str) -> int:
    name = dtype.removeprefix("torch.")
    if name not in _DTYPE_BYTES:
        raise KVTransferError(f"unsupported KV dtype {dtype!r}")
    return _DTYPE_BYTES[name]


# --- prefill side: KV held for a decoder, under an unguessable handle with a TTL ---


@dataclass(slots=True)
class HeldKV:
    handle: str
    request_id: str
    block_ids: list[int]
    token_ids: list[int]  # the prompt tokens whose KV the blocks hold
    expires_at: float


@dataclass(slots=True)
class HandleStore:
    ttl_s: float
    clock: Callable[[], float] = time.monotonic
    _held: dict[str, HeldKV] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.ttl_s <= 0:
            raise ValueError("KV handle TTL must be positive")

    def __len__(self) -> int:
        return len(self._held)

    def add(self, request_id: str, block_ids: list[int], token_ids: list[int]) -> HeldKV:
        held = HeldKV(secrets.token_urlsafe(18), request_id, list(block_ids), list(token_ids),
                      self.clock() + self.ttl_s)
        self._held[held.handle] = held
        return held

    def claim(self, handle: str) -> HeldKV | None:
        """Take a live handle out of the store (one decoder per handle)."""
        held = self._held.pop(handle, None)
        if held is not None and held.expires_at <= self.clock():
            self._held[handle] = held  # expired: leave it to the sweeper, which frees blocks
            return None
        return held

    def pop_expired(self) -> list[HeldKV]:
        now = self.clock()
        expired = [h for h in self._held.values() if h.expires_at <= now]
        for held in expired:
            del self._held[held.handle]
        return expired

    def pop_all(self) -> list[HeldKV]:
        held, self._held = list(self._held.values()), {}
        return held
