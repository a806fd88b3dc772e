"""Pure checks of a new request, so bad input fails with one clear line at the door."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.core.sequence import PreloadedKV

DTYPE_BYTES = {
    "float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "uint64": 8, "int64": 8,
    "int32": 4, "uint32": 4, "int8": 1, "uint8": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
}


def _are_token_ids(prompt: Sequence[object], vocab_size: int | None) -> bool:
    """Plain ints (not bools) in [0, vocab_size), checked by C loops (map, min, max)."""
    if set(map(type, prompt)) != {int}:
        return False
    ids = cast("Sequence[int]", prompt)
    return min(ids) >= 0 and not (vocab_size and max(ids) >= vocab_size)


def check_request(
    request_id: object,
    prompt: Sequence[object],
    params: object,
    priority: object,
    *,
    max_model_len: int,
    vocab_size: int | None,
    has_tokenizer: bool,
) -> None:
    """Raise ValueError naming what is wrong with a request; return None when it is fine."""
    if not isinstance(request_id, str) or not request_id:
        raise ValueError("request_id must be a non-empty string")
    if not isinstance(params, SamplingParams):
        raise ValueError("params must be a SamplingParams")
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError("priority must be an integer")
    if len(prompt) == 0:
        raise ValueError("the prompt is empty")
    if not _are_token_ids(prompt, vocab_size):
        for t in prompt:  # the slow path only finds the offender for the message
            if (isinstance(t, bool) or not isinstance(t, int) or t < 0
                    or (vocab_size and t >= vocab_size)):  # fmt: skip
                raise ValueError(
                    f"prompt token id {t!r} is not an integer in [0, {vocab_size or 'vocab size'})"
                )
    total = len(prompt) + params.max_tokens
    if total > max_model_len:
        raise ValueError(
            f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = {total} "
            f"exceeds max_model_len {max_model_len}"
        )
    if params.stop and not has_tokenizer:
        raise ValueError("stop strings need a tokenizer; this engine has none")


def check_preload(
    preload: PreloadedKV, num_prompt_tokens: int, block_size: int, block_bytes: int | None
) -> None:
    """The payload must cover ceil(num_tokens / block_size) whole blocks of the runner."""
    if not 1 <= preload.num_tokens <= num_prompt_tokens:
        raise ValueError(
            f"preloaded_kv.num_tokens {preload.num_tokens} must be in [1, {num_prompt_tokens}]"
        )
    num_blocks = -(-preload.num_tokens // block_size)
    if block_bytes is not None and len(preload.data) != num_blocks * block_bytes:
        raise ValueError(
            f"preloaded_kv.data has {len(preload.data)} bytes; {preload.num_tokens} tokens "
            f"need {num_blocks} blocks x {block_bytes} bytes"
        )


def bytes_per_block(dtype: str, shape: Sequence[int]) -> int | None:
    """Size of one block as `runner.kv_block_shape()` describes it; None if the dtype is
    unknown (the runner then checks payloads itself)."""
    itemsize = DTYPE_BYTES.get(str(dtype).removeprefix("torch."))
    if itemsize is None:
        return None
    n = itemsize
    for dim in shape:
        n *= dim
    return n
