"""OpenAI response bodies for completions and chat, whole and as stream chunks (pure)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass(slots=True)
class ResponseIds:
    """What every body and chunk of one request repeats."""

    is_chat: bool
    model: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.is_chat else "cmpl-") + uuid.uuid4().hex

    def head(self, *, is_chunk: bool) -> dict[str, Any]:
        if self.is_chat:
            obj = "chat.completion.chunk" if is_chunk else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}


@dataclass(slots=True)
class TokenIds:
    """vLLM's `return_token_ids` fields: the output ids a body or chunk carries, and the
    prompt's ids (on the whole answer, or a stream's first chunk; else None). Chat puts
    `prompt_token_ids` beside `choices`, completions inside the choice, as vLLM does."""

    output: list[int]
    prompt: list[int] | None = None

    def put(self, ids: ResponseIds, body: dict[str, Any], choice: dict[str, Any]) -> None:
        choice["token_ids"] = self.output
        if self.prompt is not None:
            (body if ids.is_chat else choice)["prompt_token_ids"] = self.prompt


def usage(num_prompt_tokens: int, num_output_tokens: int, num_cached_tokens: int = 0) -> dict:
    return {
        "prompt_tokens": num_prompt_tokens,
        "completion_tokens": num_output_tokens,
        "total_tokens": num_prompt_tokens + num_output_tokens,
        "prompt_tokens_details": {"cached_tokens": num_cached_tokens},
    }


def full_response(
    ids: ResponseIds, text: str, finish_reason: str | None, usage_body: dict,
    token_ids: TokenIds | None = None,
) -> dict[str, Any]:
    if ids.is_chat:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": None,
            "finish_reason": finish_reason,
        }
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
    body = {**ids.head(is_chunk=False), "choices": [choice], "usage": usage_body}
    if token_ids is not None:
        token_ids.put(ids, body, choice)
    return body


def chunk(
    ids: ResponseIds,
    text: str,
    finish_reason: str | None = None,
    *,
    is_first: bool = False,
    include_usage: bool = False,
    token_ids: TokenIds | None = None,
) -> dict[str, Any]:
    """One streamed delta. Chat's first chunk carries the assistant role."""
    if ids.is_chat:
        delta: dict[str, Any] = {"role": "assistant", "content": text} if is_first else {}
        if text and not is_first:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta}
    else:
        choice = {"index": 0, "text": text}
    choice["logprobs"] = None
    choice["finish_reason"] = finish_reason
    body = {**ids.head(is_chunk=True), "choices": [choice]}
    if token_ids is not None:
        token_ids.put(ids, body, choice)
    if include_usage:
        body["usage"] = None  # OpenAI sends null usage on every chunk but the last
    return body


def usage_chunk(ids: ResponseIds, usage_body: dict) -> dict[str, Any]:
    return {**ids.head(is_chunk=True), "choices": [], "usage": usage_body}
