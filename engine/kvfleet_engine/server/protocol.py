"""Parse and check OpenAI completion/chat request bodies (pure: no I/O, no engine).

`parse_request` turns a decoded JSON body into a `GenerationRequest` or raises an
`APIError` naming the bad field. `resolve_sampling` runs once the prompt is tokenized,
because the context-length checks need the prompt's token count.
Unknown fields are ignored, as OpenAI does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvfleet_engine import contract
from kvfleet_engine.contract.peer_prefix import PEER_PREFIX, PeerPrefix, PeerPrefixError
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.server.errors import NOT_FOUND, APIError, bad_request

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
DEFAULT_COMPLETION_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
MAX_TEMPERATURE = 2.0


@dataclass(slots=True)
class GenerationRequest:
    """One validated request; the prompt is either text, token ids, or chat messages."""

    is_chat: bool
    model: str | None = None
    prompt_text: str | None = None
    prompt_token_ids: list[int] | None = None
    messages: list[dict[str, str]] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False  # vLLM's: extend the last assistant message
    return_token_ids: bool = False  # vLLM's: prompt and output token ids in the answer
    max_tokens: int | None = None  # None: fill the rest of the context (chat) or 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    priority: int = 0
    user: str | None = None
    is_stream: bool = False
    include_usage: bool = False
    kv_transfer_params: dict[str, Any] | None = None
    peer_prefix: PeerPrefix | None = None  # kv_transfer_params.peer_prefix, checked

    @property
    def is_remote_decode(self) -> bool:
        """Prefill half of a P/D pair: compute the prompt, keep its KV for a decoder."""
        params = self.kv_transfer_params
        return bool(params and params.get(contract.DO_REMOTE_DECODE))

    @property
    def is_remote_prefill(self) -> bool:
        """Decode half of a P/D pair: pull the prompt's KV from a prefill replica."""
        params = self.kv_transfer_params
        return bool(params and params.get(contract.DO_REMOTE_PREFILL))


def parse_request(body: Any, *, is_chat: bool) -> GenerationRequest:
    if not isinstance(body, dict):
        raise bad_request("request body must be a JSON object")
    _reject_unsupported(body)
    req = GenerationRequest(is_chat=is_chat)
    req.model = _opt_str(body, "model")
    if is_chat:
        req.messages = _messages(body)
        req.continue_final_message = _bool(body, "continue_final_message", False)
        req.add_generation_prompt = _bool(body, "add_generation_prompt",
                                          not req.continue_final_message)
        _check_continuation(req)
        req.max_tokens = _opt_int(body, "max_completion_tokens", minimum=1)
        if req.max_tokens is None:
            req.max_tokens = _opt_int(body, "max_tokens", minimum=1)
    else:
        req.prompt_text, req.prompt_token_ids = _prompt(body)
        req.max_tokens = _opt_int(body, "max_tokens", minimum=1)
    req.temperature = _float(body, "temperature", 1.0, low=0.0, high=MAX_TEMPERATURE)
    req.top_p = _float(body, "top_p", 1.0, low=0.0, high=1.0, is_low_open=True)
    req.top_k = _int(body, "top_k", 0, minimum=-1)
    req.seed = _opt_int(body, "seed")
    req.stop = _stop(body)
    req.stop_token_ids = _int_list(body, "stop_token_ids")
    req.ignore_eos = _bool(body, "ignore_eos", False)
    req.priority = _int(body, "priority", 0)
    req.user = _opt_str(body, "user")
    if _opt_int(body, "n", minimum=1) not in (None, 1):
        raise bad_request("only n=1 is supported", param="n", code="unsupported_value")
    req.is_stream = _bool(body, "stream", False)
    req.include_usage = _stream_options(body, req.is_stream)
    req.return_token_ids = _bool(body, "return_token_ids", False)
    req.kv_transfer_params = _kv_transfer_params(body)
    req.peer_prefix = _peer_prefix(req.kv_transfer_params)
    return req


def _check_continuation(req: GenerationRequest) -> None:
    """vLLM's rules for `continue_final_message`: the last message is the assistant's
    (non-empty, so there is something to continue), and no generation prompt after it."""
    if not req.continue_final_message:
        return
    if req.add_generation_prompt:
        raise bad_request("Cannot set both `continue_final_message` and "
                          "`add_generation_prompt` to True.", param="continue_final_message")
    assert req.messages is not None
    last = req.messages[-1]
    if last["role"] != "assistant" or not last["content"]:
        raise bad_request("`continue_final_message` needs a non-empty assistant message last",
                          param="messages")


def check_model(requested: str | None, served_names: list[str]) -> str:
    """The served name a request targets (the first when it names none); 404 if unknown."""
    if requested is None:
        return served_names[0]
    if requested not in served_names:
        raise APIError(
            404,
            f"The model `{requested}` does not exist.",
            type=NOT_FOUND,
            param="model",
            code="model_not_found",
        )
    return requested


def resolve_sampling(
    req: GenerationRequest, num_prompt_tokens: int, max_model_len: int
) -> SamplingParams:
    """SamplingParams for a tokenized prompt, enforcing the context length."""
    prompt_param = "messages" if req.is_chat else "prompt"
    if num_prompt_tokens == 0:
        raise bad_request("the prompt is empty", param=prompt_param)
    room = max_model_len - num_prompt_tokens
    if room < 1:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, your "
            f"prompt has {num_prompt_tokens} tokens, which leaves no room for a completion.",
            param=prompt_param,
            code="context_length_exceeded",
        )
    if req.max_tokens is None:
        max_tokens = room if req.is_chat else min(DEFAULT_COMPLETION_MAX_TOKENS, room)
    elif req.max_tokens > room:
        raise bad_request(
            f"This model's maximum context length is {max_model_len} tokens. However, you "
            f"requested {num_prompt_tokens + req.max_tokens} tokens ({num_prompt_tokens} in "
            f"the prompt, {req.max_tokens} for the completion).",
            param="max_tokens",
            code="context_length_exceeded",
        )
    else:
        max_tokens = req.max_tokens
    return SamplingParams(
        max_tokens=max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        seed=req.seed,
        stop=list(req.stop),
        stop_token_ids=list(req.stop_token_ids),
        ignore_eos=req.ignore_eos,
    )


def check_token_ids(token_ids: list[int], vocab_size: int, param: str = "prompt") -> None:
    bad = [t for t in token_ids if not 0 <= t < vocab_size]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary [0, {vocab_size})", param)


# Known OpenAI features this engine does not implement: refused rather than silently
# answered without them. field -> is the value asking for the feature?
_UNSUPPORTED: dict[str, Any] = {
    "logprobs": lambda v: v not in (None, False, 0),
    "top_logprobs": lambda v: v not in (None, 0),
    "echo": lambda v: v not in (None, False),
    "best_of": lambda v: v not in (None, 1),
    "suffix": lambda v: v not in (None, ""),
    "tools": lambda v: v not in (None, []),
    "functions": lambda v: v not in (None, []),
    "response_format": lambda v: not (v is None or (isinstance(v, dict)
                                                     and v.get("type") == "text")),
    "logit_bias": lambda v: v not in (None, {}),
}


def _reject_unsupported(body: dict[str, Any]) -> None:
    for name, is_asked in _UNSUPPORTED.items():
        if name in body and is_asked(body[name]):
            raise bad_request(f"`{name}` is not supported by this server", param=name,
                              code="unsupported_value")


# --- field readers: each names the field in its error ---


def _type_error(name: str, expected: str) -> APIError:
    return bad_request(f"`{name}` must be {expected}", param=name, code="invalid_type")


INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _opt_int(body: dict[str, Any], name: str, *, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value):
        raise _type_error(name, "an integer")
    if not INT64_MIN <= value <= INT64_MAX:  # as vLLM: seeds and priorities are 64-bit
        raise bad_request(f"`{name}` must fit in 64 bits", param=name)
    if minimum is not None and value < minimum:
        raise bad_request(f"`{name}` must be at least {minimum}, got {value}", param=name)
    return int(value)


def _int(body: dict[str, Any], name: str, default: int, *, minimum: int | None = None) -> int:
    value = _opt_int(body, name, minimum=minimum)
    return default if value is None else value


def _float(
    body: dict[str, Any],
    name: str,
    default: float,
    *,
    low: float,
    high: float,
    is_low_open: bool = False,
) -> float:
    value = body.get(name)
    if value is None:
        return default
    if not (isinstance(value, int | float) and not isinstance(value, bool)):
        raise _type_error(name, "a number")
    number = float(value)
    is_too_low = number <= low if is_low_open else number < low
    if not math.isfinite(number) or is_too_low or number > high:
        bracket = "(" if is_low_open else "["
        raise bad_request(f"`{name}` must be in {bracket}{low}, {high}], got {value}", param=name)
    return number


def _bool(body: dict[str, Any], name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise _type_error(name, "a boolean")
    return value


def _opt_str(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise _type_error(name, "a string")
    return value


def _int_list(body: dict[str, Any], name: str) -> list[int]:
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise _type_error(name, "a list of integers")
    return [int(v) for v in value]


def _prompt(body: dict[str, Any]) -> tuple[str | None, list[int] | None]:
    """(text, token ids): OpenAI accepts a string, token ids, or a list of one of those."""
    value = body.get("prompt")
    if value is None:
        raise bad_request("`prompt` is required", param="prompt", code="missing_field")
    if isinstance(value, list) and value and all(isinstance(v, str | list) for v in value):
        if len(value) != 1:
            raise bad_request(
                "batched prompts are not supported; send one prompt per request",
                param="prompt",
                code="unsupported_value",
            )
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise bad_request("`prompt` must not be empty", param="prompt")
        return value, None
    if isinstance(value, list) and value and all(_is_int(v) for v in value):
        return None, [int(v) for v in value]
    raise _type_error("prompt", "a non-empty string or a non-empty list of token ids")


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    value = body.get("messages")
    if value is None:
        raise bad_request("`messages` is required", param="messages", code="missing_field")
    if not isinstance(value, list) or not value:
        raise _type_error("messages", "a non-empty list")
    out = []
    for i, message in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _type_error(where, "an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in CHAT_ROLES:
            raise bad_request(
                f"`{where}.role` must be one of {', '.join(CHAT_ROLES)}", param=f"{where}.role"
            )
        out.append({"role": role, "content": _content(message.get("content"), where)})
    return out


def _content(value: Any, where: str) -> str:
    """Message content: a string, or a list of text parts (other part types unsupported)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for part in value:
            if not (isinstance(part, dict) and part.get("type") == "text"):
                raise bad_request(
                    f"`{where}.content` parts must be text parts", param=f"{where}.content"
                )
            text = part.get("text")
            if not isinstance(text, str):
                raise _type_error(f"{where}.content.text", "a string")
            texts.append(text)
        return "".join(texts)
    raise _type_error(f"{where}.content", "a string or a list of text parts")


def _stop(body: dict[str, Any]) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise _type_error("stop", "a string or a list of strings")
    if any(not s for s in value):
        raise bad_request("`stop` strings must not be empty", param="stop")
    if len(value) > MAX_STOP_STRINGS or any(len(s) > MAX_STOP_CHARS for s in value):
        # every output token is checked against every stop string, on the shared engine
        raise bad_request(f"`stop` allows at most {MAX_STOP_STRINGS} strings of at most "
                          f"{MAX_STOP_CHARS} characters", param="stop")
    return list(value)


def _stream_options(body: dict[str, Any], is_stream: bool) -> bool:
    value = body.get("stream_options")
    if value is None:
        return False
    if not is_stream:
        raise bad_request(
            "`stream_options` is only allowed when `stream` is true", param="stream_options"
        )
    if not isinstance(value, dict):
        raise _type_error("stream_options", "an object")
    return _bool(value, "include_usage", False)


INVALID_PEER_PREFIX = "invalid_peer_prefix"  # the error code of a malformed hint


def _peer_prefix(params: dict[str, Any] | None) -> PeerPrefix | None:
    try:
        return contract.parse_peer_prefix(params)
    except PeerPrefixError as exc:
        raise bad_request(str(exc), param=f"{contract.KV_TRANSFER_PARAMS}.{PEER_PREFIX}",
                          code=INVALID_PEER_PREFIX) from None


def _kv_transfer_params(body: dict[str, Any]) -> dict[str, Any] | None:
    value = body.get(contract.KV_TRANSFER_PARAMS)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise _type_error(contract.KV_TRANSFER_PARAMS, "an object")
    return value
