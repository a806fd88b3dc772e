"""POST /v1/completions and /v1/chat/completions: whole responses and SSE streams.

A handler validates, tokenizes and admits the request, hands it to the engine thread,
then relays outputs from its mailbox. Whatever ends the handler early (client gone,
handler cancelled, error) aborts the request, so its KV blocks are freed at once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from kvfleet_engine.contract import peer_prefix as pp
from kvfleet_engine.contract.http_limits import JSONRejected, strict_loads
from kvfleet_engine.server import pd, peer_fetch
from kvfleet_engine.server.errors import SERVER_ERROR, APIError, bad_request, request_caused
from kvfleet_engine.server.metrics import RequestTimer
from kvfleet_engine.server.protocol import (
    INVALID_PEER_PREFIX,
    GenerationRequest,
    check_model,
    check_token_ids,
    parse_request,
    resolve_sampling,
)
from kvfleet_engine.server.responses import (
    ResponseIds,
    TokenIds,
    chunk,
    full_response,
    usage,
    usage_chunk,
)
from kvfleet_engine.server.sse import SSE_DONE, open_sse, sse_event
from kvfleet_engine.server.state import STATE_KEY, RequestStream, ServerState

log = logging.getLogger(__name__)

LARGE_PROMPT_CHARS = 8192  # tokenized off the event loop above this size


async def handle_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, is_chat=False)


async def handle_chat(request: web.Request) -> web.StreamResponse:
    return await _generate(request, is_chat=True)


async def read_json_body(request: web.Request, state: ServerState) -> Any:
    """The decoded JSON body, refused early: 429 when this client address already has
    `max_uploads_per_client` bodies unfinished, 413 past max_body_bytes (checked while
    reading), 408 when it takes longer than body_read_timeout_s, 400 when malformed or
    pathological (contract.http_limits: depth, digits, NaN). A client gone mid-body is
    one DEBUG line."""
    settings = state.settings
    max_bytes = settings.max_body_bytes
    too_large = APIError(413, f"request body exceeds {max_bytes} bytes", code="request_too_large",
                         is_closing=True)
    if request.content_length is not None and request.content_length > max_bytes:
        raise too_large
    addr = request.remote or ""
    if not state.uploads.acquire(addr):
        raise APIError(429, f"more than {settings.max_uploads_per_client} unfinished uploads "
                       "from this address", code="too_many_uploads", is_closing=True,
                       headers={"Retry-After": str(settings.retry_after_s)})
    parts, size = [], 0
    try:
        async with asyncio.timeout(settings.body_read_timeout_s):
            async for part in request.content.iter_chunked(64 * 1024):
                size += len(part)
                if size > max_bytes:
                    raise too_large
                parts.append(part)
    except TimeoutError:
        raise APIError(408, f"request body not received within {settings.body_read_timeout_s}s",
                       code="body_timeout", is_closing=True) from None
    except ConnectionResetError:
        log.debug("client %s went away mid-body", addr)
        raise APIError(400, "client closed the connection mid-body", code="client_gone",
                       is_closing=True) from None
    except (web.RequestPayloadError, HttpProcessingError) as exc:
        raise APIError(400, f"malformed request body: {exc}", code="bad_body",
                       is_closing=True) from None
    finally:
        state.uploads.release(addr)
    try:
        return strict_loads(b"".join(parts))
    except JSONRejected as exc:
        raise bad_request(str(exc), code=exc.code) from None


def tokenize_prompt(tokenizer: Any, req: GenerationRequest) -> list[int]:
    try:
        return _tokenize(tokenizer, req)
    except UnicodeEncodeError:  # JSON may carry lone UTF-16 surrogates; UTF-8 cannot
        raise bad_request("the prompt holds unpaired UTF-16 surrogates (\\ud800-\\udfff)",
                          param="messages" if req.messages is not None else "prompt",
                          code="invalid_text") from None


def _tokenize(tokenizer: Any, req: GenerationRequest) -> list[int]:
    if req.prompt_token_ids is not None:
        return list(req.prompt_token_ids)
    if req.messages is not None:
        try:
            text = tokenizer.apply_chat_template(req.messages, req.add_generation_prompt)
        except ValueError as exc:  # the model's template rejected the conversation
            raise bad_request(f"chat template: {exc}", param="messages") from None
        if req.continue_final_message:
            text = _cut_after_final_message(text, req.messages[-1]["content"])
        return list(tokenizer.encode(text))
    return list(tokenizer.encode(req.prompt_text or ""))


def _cut_after_final_message(text: str, final: str) -> str:
    """The rendered conversation up to the end of the final (assistant) message, without
    the end-of-turn the template puts after it, so generation continues that message (as
    transformers' `continue_final_message`)."""
    for content in (final, final.strip()):  # some templates trim message content
        end = text.rfind(content)
        if end >= 0:
            return text[:end + len(content)]
    raise bad_request("the chat template does not render the final message's content "
                      "verbatim, so it cannot be continued", param="messages")


def _prompt_size(req: GenerationRequest) -> int:
    if req.messages is not None:
        return sum(len(m["content"]) for m in req.messages)
    return len(req.prompt_text or "")


async def _prepare(request: web.Request, state: ServerState,
                   is_chat: bool) -> tuple[GenerationRequest, str, list[int], Any, bool]:
    """Read, validate and tokenize: everything that depends on the request alone."""
    settings = state.settings
    req = parse_request(await read_json_body(request, state), is_chat=is_chat)
    model = check_model(req.model, settings.served_model_names)
    if _prompt_size(req) > LARGE_PROMPT_CHARS:  # keep the loop free for other streams
        prompt_ids = await asyncio.to_thread(tokenize_prompt, state.tokenizer, req)
    else:
        prompt_ids = tokenize_prompt(state.tokenizer, req)
    check_token_ids(prompt_ids, settings.vocab_size, "messages" if is_chat else "prompt")
    params = resolve_sampling(req, len(prompt_ids), settings.max_model_len)
    params, hold_kv = pd.plan_prefill(req, params)
    return req, model, prompt_ids, params, hold_kv


async def _generate(request: web.Request, *, is_chat: bool) -> web.StreamResponse:
    arrival = time.monotonic()  # TTFT and E2E count from here, as the client sees them
    state: ServerState = request.app[STATE_KEY]
    state.check_admission()  # cheap early 503 before reading the body
    try:
        req, model, prompt_ids, params, hold_kv = await _prepare(request, state, is_chat)
    except APIError as exc:
        if exc.code == INVALID_PEER_PREFIX:
            state.metrics.peer.count(pp.OUTCOME_INVALID)
        raise
    except Exception as exc:  # noqa: BLE001 - a function of this request alone: say so
        raise request_caused(exc) from None
    state.check_admission()
    state.inject_fault()
    ids = ResponseIds(is_chat=is_chat, model=model)
    request_id = ids.id
    stream = state.open_stream(request_id)
    timer = RequestTimer(state.metrics, arrival)
    is_settled = False  # True once the engine is done with the request
    try:
        preloaded = fetched = None
        if req.is_remote_prefill:
            preloaded = await pd.pull_prompt_kv(state, req, prompt_ids)
        elif req.peer_prefix is not None:  # never fails: a failed fetch is a recompute
            fetched = await peer_fetch.fetch_peer_prefix(state, req.peer_prefix, prompt_ids)
        added = state.engine.add_request(
            request_id, prompt_ids, params, priority=req.priority, hold_kv=hold_kv,
            preloaded_kv=preloaded, prefix_kv=fetched.prefix if fetched else None)
        if fetched is not None:
            peer_fetch.record(state.metrics.peer, fetched, await added,
                              state.settings.block_size)
        if req.is_stream:
            response = await _stream(request, req, ids, stream, timer, prompt_ids)
        else:
            response = await _whole(state, req, ids, stream, timer, prompt_ids, hold_kv)
        is_settled = True
        return response
    finally:
        state.close_stream(request_id)
        if not is_settled:
            state.engine.abort(request_id)


async def _outputs(stream: RequestStream, timer: RequestTimer) -> AsyncIterator[Any]:
    """The request's outputs in order, up to and including the finished one."""
    while True:
        item = await stream.queue.get()
        if isinstance(item, BaseException):
            raise _engine_error(item)
        timer.on_output(item, time.monotonic())
        yield item
        if item.is_finished:
            return


async def _chain(first: Any, rest: AsyncIterator[Any]) -> AsyncIterator[Any]:
    yield first
    async for item in rest:
        yield item


def _engine_error(exc: BaseException) -> APIError:
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, ValueError):  # the engine refused the request's shape
        return bad_request(str(exc))
    log.error("request failed in the engine: %r", exc)
    return APIError(500, f"engine error: {exc}", type=SERVER_ERROR)


async def _whole(
    state: ServerState,
    req: GenerationRequest,
    ids: ResponseIds,
    stream: RequestStream,
    timer: RequestTimer,
    prompt_ids: list[int],
    hold_kv: bool,
) -> web.Response:
    last = None
    async for output in _outputs(stream, timer):
        last = output
    assert last is not None
    body = full_response(
        ids, last.text, last.finish_reason,
        usage(last.num_prompt_tokens, len(last.token_ids), last.num_cached_tokens),
        TokenIds(list(last.token_ids), prompt_ids) if req.return_token_ids else None,
    )
    if hold_kv:
        body[pd.KV_TRANSFER_PARAMS] = await pd.publish_held_kv(
            state, ids.id, prompt_ids, last.token_ids
        )
    return web.json_response(body)


async def _stream(
    request: web.Request,
    req: GenerationRequest,
    ids: ResponseIds,
    stream: RequestStream,
    timer: RequestTimer,
    prompt_ids: list[int],
) -> web.StreamResponse:
    outputs = _outputs(stream, timer)
    # Headers wait for the first output: an engine refusal still gets its HTTP status,
    # and a router may retry elsewhere until the first byte.
    first = await anext(outputs)
    response = await open_sse(request)
    is_first = True
    last = None
    # With return_token_ids a chunk carries the ids whose text it completes: ids whose
    # text the detokenizer still holds back wait for the chunk that shows it, so a
    # router that continues a broken stream from the ids sent loses no text.
    pending: list[int] = []
    try:
        async for output in _chain(first, outputs):
            last = output
            pending.extend(output.new_token_ids)
            finish = output.finish_reason if output.is_finished else None
            if output.new_text or finish or is_first:
                token_ids = None
                if req.return_token_ids:  # a first chunk without text keeps them waiting
                    shown = pending if output.new_text or finish else []
                    token_ids = TokenIds(shown, prompt_ids if is_first else None)
                    pending = [] if shown else pending
                payload = chunk(ids, output.new_text, finish, is_first=is_first,
                                include_usage=req.include_usage, token_ids=token_ids)
                await response.write(sse_event(payload))
                is_first = False
    except APIError as exc:  # headers are out: report in-band, as OpenAI does
        await response.write(sse_event(exc.to_dict()))
        await response.write(SSE_DONE)
        return response
    if req.include_usage and last is not None:
        usage_body = usage(last.num_prompt_tokens, len(last.token_ids), last.num_cached_tokens)
        await response.write(sse_event(usage_chunk(ids, usage_body)))
    await response.write(SSE_DONE)
    await response.write_eof()
    return response

