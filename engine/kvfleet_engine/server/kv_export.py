"""POST /v1/kv_cache/export: a peer asks for the KV of cached prefix blocks, by hash.

Read-only and behind the engine token, like /v1/kv_transfer. The body is
`{"block_hashes": [h0, h1, ...]}` (chained hashes from the root, at most
`MAX_PEER_PREFIX_BLOCKS`); the answer is one KVT1 frame (`core.kv_transfer`) holding the
longest leading run of them this replica still caches, possibly empty, cut to
`--kv-export-max-bytes` of payload. The header carries each block's hash, the tokens
and the served model, so the importer can check everything against its own prompt.
The lookup and the read run together under the engine thread's bookkeeping lock
(`EngineThread.read`), so no block can be evicted half-read, and while a step computes:
an export does not wait for the step to end. A draining replica still exports: its cache
stays fetchable until it stops.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.core.kv_transfer import make_header, pack_frame
from kvfleet_engine.core.request_checks import bytes_per_block
from kvfleet_engine.server.errors import SERVER_ERROR, APIError, bad_request, check_bearer
from kvfleet_engine.server.generate import read_json_body
from kvfleet_engine.server.state import STATE_KEY

HASHES = "block_hashes"
LARGE_PAYLOAD = 1 << 20  # checksummed off the event loop above this size


def parse_export_body(body: Any) -> list[int]:
    """The asked hashes; 400 naming the field when the body is not what the contract says."""
    hashes = body.get(HASHES) if isinstance(body, dict) else None
    if not isinstance(hashes, list) or not hashes:
        raise bad_request(f"`{HASHES}` must be a non-empty list", param=HASHES)
    if len(hashes) > pp.MAX_PEER_PREFIX_BLOCKS:
        raise bad_request(f"`{HASHES}` allows at most {pp.MAX_PEER_PREFIX_BLOCKS} entries",
                          param=HASHES)
    if not all(type(h) is int and 0 <= h < pp.MAX_HASH for h in hashes):
        raise bad_request(f"`{HASHES}` must hold integers in [0, 2**63)", param=HASHES,
                          code="invalid_type")
    return hashes


async def handle_kv_export(request: web.Request) -> web.Response:
    state = request.app[STATE_KEY]
    settings = state.settings
    check_bearer(request.headers.get("Authorization"), settings.internal_token)
    hashes = parse_export_body(await read_json_body(request, state))
    if not state.engine.is_alive:
        raise APIError(503, "the engine has stopped", type=SERVER_ERROR, code="engine_stopped")
    dtype, shape = state.kv_block_shape
    max_blocks = settings.kv_export_max_bytes // max(1, bytes_per_block(dtype, shape) or 1)
    state.num_busy_transfers += 1
    try:
        out = await state.engine.read(lambda e: e.export_prefix(hashes, max_blocks))

        def frame() -> bytes:
            header = make_header(dtype=dtype, block_shape=shape,
                                 num_blocks=len(out.block_hashes), token_ids=out.token_ids,
                                 block_size=settings.block_size, payload=out.data,
                                 engine_id=settings.engine_id, block_hashes=out.block_hashes,
                                 model=settings.served_model_names[0])
            return pack_frame(header, out.data)

        body = await asyncio.to_thread(frame) if len(out.data) > LARGE_PAYLOAD else frame()
    finally:
        state.num_busy_transfers -= 1
    state.metrics.peer.export_blocks.inc(len(out.block_hashes))
    state.metrics.peer.export_bytes.inc(len(out.data))
    return web.Response(body=body, content_type="application/octet-stream")
