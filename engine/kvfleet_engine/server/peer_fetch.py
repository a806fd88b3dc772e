"""Importing side of peer prefix sharing: fetch a hinted prefix before the request is added.

`fetch_peer_prefix` runs on the event loop (async I/O with a timeout; the engine thread
keeps stepping meanwhile). It asks the peer only for the blocks whose hinted hashes equal
the prompt's own chained hashes, checks the answer against the prompt
(`core.prefix_share.check_export`), and returns the blocks as `PrefixKV` for
`LLMEngine.add_request(prefix_kv=...)`, or None with the reason. Nothing here raises: a
failed fetch means the request computes its prompt. `record` counts the outcome once the
engine has installed (or refused) the blocks. A fetch that timed out also reports the KV
bytes it asked for (blocks asked x the block geometry's bytes) and the seconds it waited:
it proves the link is at most that fast, which a router learns even when no fetch ever
completes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.core.kv_transfer import KVHeader, KVTransferError, unpack_frame
from kvfleet_engine.core.prefix_share import (
    PrefixInstall,
    PrefixMismatch,
    chained_hashes,
    check_export,
    num_agreeing,
    num_usable_blocks,
)
from kvfleet_engine.core.request_checks import bytes_per_block
from kvfleet_engine.core.sequence import PrefixKV
from kvfleet_engine.server.kv_fetch import fetch_frame
from kvfleet_engine.server.peer_metrics import PeerPrefixMetrics
from kvfleet_engine.server.state import ServerState

log = logging.getLogger(__name__)

LARGE_FRAME = 1 << 20  # unpacked (checksummed) off the event loop above this size
HEADER_SLACK = 32 << 20  # frame bytes beyond the payload limit: magic, header, token ids


@dataclass(slots=True)
class FetchResult:
    outcome: str
    prefix: PrefixKV | None = None
    num_asked: int = 0
    num_bytes: int = 0
    seconds: float = 0.0
    timeout_bytes: int = 0  # a timed-out fetch: KV bytes it asked for
    timeout_seconds: float = 0.0  # and how long it waited


def failure_outcome(exc: KVTransferError) -> str:
    """Pure: the metric outcome of a fetch that raised."""
    if isinstance(exc, PrefixMismatch):
        return pp.OUTCOME_MISMATCH
    if exc.is_timeout:
        return pp.OUTCOME_TIMEOUT
    if exc.status in (401, 403):
        return pp.OUTCOME_UNAUTHORIZED
    if exc.is_unreachable:
        return pp.OUTCOME_UNREACHABLE
    return pp.OUTCOME_ERROR


def installed_outcome(fetched: FetchResult, installed: PrefixInstall | None) -> str:
    """Pure: the outcome of a fetch once the engine took (or refused) its blocks."""
    if fetched.prefix is None:
        return fetched.outcome
    if installed is None:  # the engine refused the request itself
        return pp.OUTCOME_ERROR
    if installed.is_no_room:
        return pp.OUTCOME_NO_ROOM
    if installed.num_blocks == 0:
        return pp.OUTCOME_SKIPPED
    return pp.OUTCOME_HIT if installed.num_blocks >= fetched.num_asked else pp.OUTCOME_PARTIAL


async def fetch_peer_prefix(state: ServerState, hint: pp.PeerPrefix,
                            prompt_ids: list[int]) -> FetchResult:
    settings = state.settings
    bs = settings.block_size
    n = min(len(hint.block_hashes), num_usable_blocks(len(prompt_ids), bs))
    if n == 0 or not settings.enable_prefix_caching:
        return FetchResult(pp.OUTCOME_SKIPPED)
    own = chained_hashes(prompt_ids, bs, n)
    asked = own[:num_agreeing(own, hint.block_hashes)]
    if not asked:
        return FetchResult(pp.OUTCOME_MISMATCH)
    started = time.monotonic()
    try:
        frame = await fetch_frame(
            hint.export_url, timeout_s=hint.fetch_timeout_s(settings.peer_fetch_timeout_s),
            token=settings.internal_token, session=state.peer_session,
            json_body={"block_hashes": asked},
            max_bytes=settings.kv_export_max_bytes + HEADER_SLACK)
        header, payload = await _unpack(frame)
        dtype, shape = state.kv_block_shape
        num = check_export(header, asked=asked, prompt_ids=prompt_ids, dtype=dtype,
                           block_shape=shape, block_size=bs,
                           model=settings.served_model_names[0])
    except KVTransferError as exc:
        outcome = failure_outcome(exc)
        log.info("peer prefix from %s not used (%s): %s", hint.url, outcome, exc)
        if outcome != pp.OUTCOME_TIMEOUT:
            return FetchResult(outcome, num_asked=len(asked))
        block_bytes = bytes_per_block(*state.kv_block_shape) or 0
        return FetchResult(outcome, num_asked=len(asked),
                           timeout_bytes=len(asked) * block_bytes,
                           timeout_seconds=time.monotonic() - started)
    seconds = time.monotonic() - started
    if num == 0:
        return FetchResult(pp.OUTCOME_MISS, num_asked=len(asked), seconds=seconds)
    return FetchResult(pp.OUTCOME_HIT if num == len(asked) else pp.OUTCOME_PARTIAL,
                       PrefixKV(list(header.block_hashes), payload), len(asked), len(payload),
                       seconds)


def record(metrics: PeerPrefixMetrics, fetched: FetchResult, installed: PrefixInstall | None,
           block_size: int) -> str:
    outcome = installed_outcome(fetched, installed)
    metrics.count(outcome)
    metrics.bytes.inc(fetched.num_bytes)
    if fetched.seconds > 0:
        metrics.seconds.observe(fetched.seconds)
    if fetched.timeout_bytes > 0 and fetched.timeout_seconds > 0:  # both or neither
        metrics.timeout_bytes.inc(fetched.timeout_bytes)
        metrics.timeout_seconds.inc(fetched.timeout_seconds)
    if installed is not None and outcome in (pp.OUTCOME_HIT, pp.OUTCOME_PARTIAL):
        metrics.blocks.inc(installed.num_written)
        metrics.tokens.inc(installed.num_written * block_size)
    return outcome


async def _unpack(frame: bytes) -> tuple[KVHeader, bytes]:
    if len(frame) > LARGE_FRAME:
        return await asyncio.to_thread(unpack_frame, frame)
    return unpack_frame(frame)
