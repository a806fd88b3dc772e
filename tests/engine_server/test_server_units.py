"""Pure parts of the server: request parsing, sampling resolution, drain state, the KV
transfer frame and handle store, the KV-event hub, and the engine thread in-process."""

from __future__ import annotations

import asyncio

import pytest
from kvfleet_engine.contract import KVEvent
from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.kv_transfer import (
    HandleStore,
    KVTransferError,
    check_compatible,
    make_header,
    pack_frame,
    unpack_frame,
)
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.runners.sim_runner import SimulatedRunner
from kvfleet_engine.server.drain import DrainState, Phase
from kvfleet_engine.server.engine_thread import EngineThread
from kvfleet_engine.server.errors import APIError
from kvfleet_engine.server.kv_events import KVEventHub
from kvfleet_engine.server.protocol import check_model, parse_request, resolve_sampling
from kvfleet_engine.server.responses import ResponseIds, chunk

# --- parsing ---


def test_completion_defaults():
    req = parse_request({"prompt": "hi"}, is_chat=False)
    assert (req.prompt_text, req.max_tokens, req.temperature, req.top_p) == ("hi", None, 1.0, 1.0)
    assert (req.is_stream, req.include_usage, req.priority, req.stop) == (False, False, 0, [])


@pytest.mark.parametrize("prompt, text, ids", [
    ("x", "x", None), (["x"], "x", None), ([5, 6], None, [5, 6]), ([[5, 6]], None, [5, 6]),
])
def test_prompt_forms(prompt, text, ids):
    req = parse_request({"prompt": prompt}, is_chat=False)
    assert (req.prompt_text, req.prompt_token_ids) == (text, ids)


def test_chat_prefers_max_completion_tokens_and_joins_text_parts():
    req = parse_request({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}],
        "max_tokens": 9, "max_completion_tokens": 4, "stop": "x",
        "stream": True, "stream_options": {"include_usage": True}}, is_chat=True)
    assert req.messages == [{"role": "user", "content": "ab"}]
    assert (req.max_tokens, req.stop, req.include_usage) == (4, ["x"], True)


def test_unknown_fields_are_ignored():
    req = parse_request({"prompt": "x", "whatever": [1], "metadata": {"a": "b"}}, is_chat=False)
    assert req.prompt_text == "x"


def test_check_model():
    assert check_model(None, ["a", "b"]) == "a"
    assert check_model("b", ["a", "b"]) == "b"
    with pytest.raises(APIError) as err:
        check_model("c", ["a"])
    assert (err.value.status, err.value.code) == (404, "model_not_found")


@pytest.mark.parametrize("is_chat, max_tokens, num_prompt, want", [
    (False, None, 10, 16),  # OpenAI's completion default
    (False, None, 60, 4),  # ...clipped to the room left
    (True, None, 10, 54),  # chat: the rest of the context
    (False, 54, 10, 54),  # exactly fills the context
])
def test_resolve_sampling_max_tokens(is_chat, max_tokens, num_prompt, want):
    req = parse_request({"messages": [{"role": "user", "content": "x"}]} if is_chat
                        else {"prompt": "x"}, is_chat=is_chat)
    req.max_tokens = max_tokens
    assert resolve_sampling(req, num_prompt, max_model_len=64).max_tokens == want


@pytest.mark.parametrize("max_tokens, num_prompt, param", [
    (55, 10, "max_tokens"), (None, 64, "prompt"), (None, 0, "prompt"),
])
def test_resolve_sampling_rejects_what_cannot_fit(max_tokens, num_prompt, param):
    req = parse_request({"prompt": "x"}, is_chat=False)
    req.max_tokens = max_tokens
    with pytest.raises(APIError) as err:
        resolve_sampling(req, num_prompt, max_model_len=64)
    assert (err.value.status, err.value.param) == (400, param)


def test_resolve_sampling_carries_the_sampling_knobs():
    body = {"prompt": "x", "temperature": 0.3, "top_p": 0.8, "top_k": 5, "seed": 9}
    params = resolve_sampling(parse_request(body, is_chat=False), 1, max_model_len=64)
    assert (params.temperature, params.top_p, params.top_k, params.seed) == (0.3, 0.8, 5, 9)
    greedy = parse_request({"prompt": "x", "temperature": 0}, is_chat=False)
    assert resolve_sampling(greedy, 1, max_model_len=64).is_greedy


def test_chat_stream_chunks_carry_role_first():
    ids = ResponseIds(is_chat=True, model="m")
    first = chunk(ids, "a", is_first=True)
    later = chunk(ids, "b", "stop")
    assert first["choices"][0]["delta"] == {"role": "assistant", "content": "a"}
    assert later["choices"][0] == {"index": 0, "delta": {"content": "b"}, "logprobs": None,
                                   "finish_reason": "stop"}
    assert first["id"] == later["id"] and first["object"] == "chat.completion.chunk"


# --- drain ---


def test_drain_state_machine():
    drain = DrainState(timeout_s=10)
    assert drain.is_admitting and not drain.can_stop(0, 0)
    assert drain.begin(100.0) and not drain.begin(101.0)
    assert not drain.is_admitting and drain.is_draining
    assert not drain.can_stop(105.0, num_in_flight=3)
    assert drain.can_stop(105.0, num_in_flight=0) and drain.phase is Phase.STOPPED
    timed_out = DrainState(timeout_s=10)
    timed_out.begin(0.0)
    assert not timed_out.can_stop(9.9, 1) and timed_out.can_stop(10.0, 1)
    with pytest.raises(ValueError):
        DrainState(timeout_s=-1)


# --- KV transfer frame and handles ---


def _frame(payload: bytes = bytes(range(64)) * 2, token_ids=(1, 2, 3)) -> bytes:
    header = make_header(dtype="float32", block_shape=[2, 16], num_blocks=1,
                         token_ids=list(token_ids), block_size=4, payload=payload)
    return pack_frame(header, payload)


def test_frame_round_trip():
    header, payload = unpack_frame(_frame())
    assert payload == bytes(range(64)) * 2
    assert (header.dtype, header.block_shape, header.num_tokens) == ("float32", [2, 16], 3)
    check_compatible(header, dtype="float32", block_shape=[2, 16], block_size=4,
                     token_ids=[1, 2, 3, 4])


@pytest.mark.parametrize("damage", ["truncate", "flip", "magic", "header"])
def test_damaged_frames_are_refused(damage):
    frame = bytearray(_frame())
    if damage == "truncate":
        frame = frame[:-5]
    elif damage == "flip":
        frame[-1] ^= 0xFF
    elif damage == "magic":
        frame[0:4] = b"NOPE"
    else:
        frame = frame[:12]
    with pytest.raises(KVTransferError):
        unpack_frame(bytes(frame))


def test_size_mismatch_between_shape_and_payload_is_refused():
    with pytest.raises(KVTransferError, match="make"):
        unpack_frame(_frame(payload=b"\0" * 100))


@pytest.mark.parametrize("kwargs, match", [
    (dict(dtype="float16"), "cache"), (dict(block_shape=[2, 8]), "cache"),
    (dict(block_size=8), "block size"), (dict(token_ids=[1, 2, 9]), "different prompt"),
])
def test_incompatible_kv_is_refused(kwargs, match):
    header, _ = unpack_frame(_frame())
    local = dict(dtype="float32", block_shape=[2, 16], block_size=4, token_ids=[1, 2, 3])
    with pytest.raises(KVTransferError, match=match):
        check_compatible(header, **{**local, **kwargs})


def test_handle_store_claims_once_and_expires():
    now = [0.0]
    store = HandleStore(ttl_s=5, clock=lambda: now[0])
    a = store.add("req-a", [3, 4], [1, 2])
    b = store.add("req-b", [5], [7])
    assert a.handle != b.handle and len(store) == 2
    assert store.claim(a.handle) is a and store.claim(a.handle) is None
    now[0] = 6.0
    assert store.claim(b.handle) is None  # expired: left for the sweeper
    assert store.pop_expired() == [b] and len(store) == 0


# --- KV-event hub ---


def _event(seq: int) -> KVEvent:
    return KVEvent(seq=seq, type="BlockStored", block_hashes=[seq])


async def test_hub_backlog_resume_and_slow_reader():
    hub = KVEventHub(max_backlog=3, max_pending_per_reader=2)
    hub.publish([_event(0), _event(1), _event(2), _event(3)])
    backlog, reader = hub.subscribe(since=1)
    assert [b'"seq":2' in line for line in backlog] == [True, False]
    hub.publish([_event(4), _event(5), _event(6)])  # reader falls behind at 2 pending
    lines = [reader.get_nowait() for _ in range(reader.qsize())]
    assert lines[-1] == b"" and len(lines) == 3  # two events, then the cut-off sentinel
    hub.close()


# --- engine thread, in process, with the simulated runner ---


async def test_engine_thread_delivers_outputs_and_aborts():
    config = EngineConfig(num_blocks=64, block_size=16, max_model_len=256)
    # "sleep": each step takes the profile's ~2 ms, so "b" is still running when aborted
    runner = SimulatedRunner("cpu-tiny", num_blocks=64, block_size=16, time_mode="sleep")
    engine = LLMEngine(config, runner)
    loop = asyncio.get_running_loop()
    got: dict[str, list] = {"a": [], "b": []}
    errors: list = []
    done = asyncio.Event()

    def on_outputs(outputs):
        for o in outputs:
            got[o.request_id].append(o)
            if o.request_id == "a" and o.is_finished:
                done.set()

    thread = EngineThread(engine, loop, on_outputs=on_outputs,
                          on_error=lambda rid, exc: errors.append((rid, exc)))
    thread.start()
    try:
        thread.add_request("a", [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True))
        thread.add_request("b", [4, 5], SamplingParams(max_tokens=250, ignore_eos=True))
        thread.add_request("a", [1], SamplingParams())  # duplicate id: reported, not fatal
        await asyncio.wait_for(done.wait(), 10)
        thread.abort("b")
        blocks = await thread.call(lambda e: e.stats().num_running)
        assert blocks == 0
        assert await thread.call(lambda e: e.kv_cache.usage()) == 0
        with pytest.raises(KeyError):
            await thread.call(lambda e: e.get_held_blocks("nope"))
    finally:
        thread.stop()
    assert len(got["a"]) == 5 and got["a"][-1].finish_reason == "length"
    assert errors and errors[0][0] == "a" and isinstance(errors[0][1], ValueError)
    assert 0 < len(got["b"]) < 250 and not any(o.finish_reason == "length" for o in got["b"])


@pytest.mark.parametrize("field, value", [
    ("logprobs", 1), ("top_logprobs", 2), ("echo", True), ("best_of", 2), ("suffix", "z"),
    ("tools", [{"type": "function"}]), ("response_format", {"type": "json_object"}),
    ("logit_bias", {"1": 2}),
])
def test_known_but_unsupported_features_are_refused(field, value):
    with pytest.raises(APIError) as err:
        parse_request({"prompt": "x", field: value}, is_chat=False)
    assert (err.value.status, err.value.param, err.value.code) == (400, field, "unsupported_value")


@pytest.mark.parametrize("field, value", [
    ("logprobs", None), ("logprobs", False), ("echo", False), ("best_of", 1),
    ("response_format", {"type": "text"}), ("tools", []), ("logit_bias", {}),
])
def test_unsupported_features_at_their_defaults_are_fine(field, value):
    assert parse_request({"prompt": "x", field: value}, is_chat=False).prompt_text == "x"


async def test_a_crashing_engine_fails_its_requests_and_reports_dead():
    config = EngineConfig(num_blocks=64, block_size=16, max_model_len=256)
    runner = SimulatedRunner("cpu-tiny", num_blocks=64, block_size=16, time_mode="sleep")
    engine = LLMEngine(config, runner)
    real_step = engine.step
    num_steps = [0]

    def failing_step():  # fault injection: the runner blows up on the third step
        num_steps[0] += 1
        if num_steps[0] == 3:
            raise RuntimeError("simulated device fault")
        return real_step()

    engine.step = failing_step
    errors: list = []
    thread = EngineThread(engine, asyncio.get_running_loop(), on_outputs=lambda outs: None,
                          on_error=lambda rid, exc: errors.append((rid, str(exc))))
    thread.start()
    try:
        thread.add_request("a", [1, 2, 3], SamplingParams(max_tokens=50, ignore_eos=True))
        for _ in range(200):
            if errors:
                break
            await asyncio.sleep(0.01)
        assert errors == [("a", "simulated device fault")]
        assert thread.is_alive  # a failed step fails its batch; the thread keeps serving
        real_stats = engine.stats

        def broken_stats():  # breaks once "b" is in (the idle thread calls stats too)
            if engine.has_unfinished_requests():
                raise RuntimeError("stats broke")
            return real_stats()

        engine.stats = broken_stats
        thread.add_request("b", [4], SamplingParams(max_tokens=50, ignore_eos=True))
        for _ in range(200):
            if not thread.is_alive:
                break
            await asyncio.sleep(0.01)
        assert not thread.is_alive
        await asyncio.sleep(0.05)
        assert errors[-1] == ("b", "stats broke")
    finally:
        thread.stop()
