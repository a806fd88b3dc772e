"""Prefill/decode disaggregation over HTTP, with vLLM NixlConnector's kv_transfer_params.

Flow (what a router does with vLLM, unchanged for kvfleet engines):
1. Prefill: the request carries `kv_transfer_params: {do_remote_decode: true}`. The
   replica computes the prompt, samples one token, keeps the prompt's KV blocks under
   a handle (TTL) and answers with `kv_transfer_params: {do_remote_prefill: true,
   remote_host, remote_port, remote_handle, remote_block_ids, remote_engine_id}`.
2. Decode: the same request with those params goes to a decode replica, which GETs
   /v1/kv_transfer/{handle} from the prefill replica, installs the blocks as
   preloaded KV and generates as if it had computed the prompt itself.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from aiohttp import web

from kvfleet_engine import contract
from kvfleet_engine.core.kv_transfer import (
    KVTransferError,
    check_compatible,
    make_header,
    pack_frame,
    unpack_frame,
)
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.core.sequence import PreloadedKV
from kvfleet_engine.server.errors import (
    KV_TRANSFER,
    NOT_FOUND,
    APIError,
    bad_request,
    check_bearer,
)
from kvfleet_engine.server.kv_fetch import fetch_frame
from kvfleet_engine.server.protocol import GenerationRequest
from kvfleet_engine.server.state import STATE_KEY, ServerState

log = logging.getLogger(__name__)

KV_TRANSFER_PARAMS = contract.KV_TRANSFER_PARAMS
TRANSFER_PATH = "/v1/kv_transfer/{handle}"


def plan_prefill(req: GenerationRequest, params: SamplingParams) -> tuple[SamplingParams, bool]:
    """(params, hold_kv): a remote-decode request computes the prompt and one token."""
    if not req.is_remote_decode:
        return params, False
    if req.is_stream:
        raise bad_request("a prefill request (do_remote_decode) cannot stream",
                          param=KV_TRANSFER_PARAMS)
    params.max_tokens = 1
    return params, True


async def publish_held_kv(state: ServerState, request_id: str, prompt_ids: list[int],
                          output_ids: list[int]) -> dict[str, Any]:
    """Register the finished prefill's held blocks under a handle; the response params."""
    engine = state.engine
    block_ids = await engine.call(lambda e: list(e.get_held_blocks(request_id)))
    num_blocks = math.ceil(len(prompt_ids) / state.settings.block_size)
    held = state.handles.add(request_id, block_ids[:num_blocks], prompt_ids)
    settings = state.settings
    return {
        contract.DO_REMOTE_DECODE: False,
        contract.DO_REMOTE_PREFILL: True,
        contract.REMOTE_HOST: settings.remote_host,
        contract.REMOTE_PORT: settings.port,
        contract.REMOTE_HANDLE: held.handle,
        contract.REMOTE_BLOCK_IDS: held.block_ids,
        "remote_engine_id": settings.engine_id,
        "remote_num_tokens": len(prompt_ids),
        "first_token_ids": list(output_ids),
    }


async def release_held(state: ServerState, request_id: str) -> None:
    try:
        await state.engine.call(lambda e: e.release_held(request_id))
    except Exception:  # noqa: BLE001 - already gone; nothing to free
        log.warning("releasing held KV of %s failed", request_id, exc_info=True)


async def handle_kv_transfer(request: web.Request) -> web.Response:
    """GET /v1/kv_transfer/{handle}: the held blocks as one frame; then they are freed."""
    state = request.app[STATE_KEY]
    check_bearer(request.headers.get("Authorization"), state.settings.internal_token)
    held = state.handles.claim(request.match_info["handle"])
    if held is None:
        raise APIError(404, "unknown or expired KV handle", type=NOT_FOUND, code="kv_handle")
    state.num_busy_transfers += 1
    try:
        def read(engine: Any) -> tuple[bytes, tuple[str, list[int]]]:
            return engine.runner.read_blocks(held.block_ids), engine.runner.kv_block_shape()

        # A held request's blocks are final: read them while a step computes, not after it.
        payload, (dtype, block_shape) = await state.engine.read(read)
        header = make_header(dtype=dtype, block_shape=block_shape, num_blocks=len(held.block_ids),
                             token_ids=held.token_ids, block_size=state.settings.block_size,
                             payload=payload, engine_id=state.settings.engine_id)
        return web.Response(body=pack_frame(header, payload),
                            content_type="application/octet-stream")
    finally:
        state.num_busy_transfers -= 1
        await release_held(state, held.request_id)


async def pull_prompt_kv(state: ServerState, req: GenerationRequest,
                         prompt_ids: list[int]) -> PreloadedKV:
    """Fetch and check the prompt's KV named by kv_transfer_params; APIError 502/504 if not."""
    params = req.kv_transfer_params or {}
    host, port, handle = (params.get(contract.REMOTE_HOST), params.get(contract.REMOTE_PORT),
                          params.get(contract.REMOTE_HANDLE))
    if not (isinstance(host, str) and host and isinstance(port, int) and not isinstance(port, bool)
            and isinstance(handle, str) and handle):
        raise bad_request(
            "do_remote_prefill needs remote_host (string), remote_port (integer) and "
            "remote_handle (string)", param=KV_TRANSFER_PARAMS)
    url = f"http://{_url_host(host)}:{port}{TRANSFER_PATH.format(handle=handle)}"
    try:
        frame = await fetch_frame(url, timeout_s=state.settings.kv_transfer_timeout_s,
                                  token=state.settings.internal_token)
        header, payload = unpack_frame(frame)
        dtype, block_shape = await state.engine.call(lambda e: e.runner.kv_block_shape())
        check_compatible(header, dtype=dtype, block_shape=block_shape,
                         block_size=state.settings.block_size, token_ids=prompt_ids)
    except KVTransferError as exc:
        raise APIError(504 if exc.is_timeout else 502, f"KV transfer failed: {exc}",
                       type=KV_TRANSFER, param=KV_TRANSFER_PARAMS, code="kv_transfer_failed"
                       ) from None
    return PreloadedKV(num_tokens=header.num_tokens, data=payload)


async def sweep_expired_handles(state: ServerState, period_s: float = 1.0) -> None:
    """Free KV of handles no decoder claimed within their TTL (runs for the server's life)."""
    while True:
        await asyncio.sleep(period_s)
        for held in state.handles.pop_expired():
            log.info("KV handle for %s expired unclaimed; freeing its blocks", held.request_id)
            await release_held(state, held.request_id)


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host
