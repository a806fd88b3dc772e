"""Request migration: a stream whose endpoint broke after the first byte continues on
another endpoint, and the client sees one stream (pure: no I/O).

- `StreamLedger` keeps what the client was sent. With migration on, the proxy forwards
  only whole SSE events (`feed` holds a partial one back), so the client never holds half
  an event that the continuation could not finish. Events are kept as bytes and parsed
  only when a stream breaks, or when more than `_FOLD_BYTES` are held (long streams), so
  a stream that never breaks costs a `rfind` per chunk.
- `continuation` builds the request that continues a broken stream: the prompt plus what
  was generated, `max_tokens` less what was sent. With the output token ids (vLLM's
  `return_token_ids`, which the router asks for), the continuation is token-exact: a
  completion over the prompt's ids and the generated ids (chat too: its first chunk
  carries the templated prompt's ids). Without them, text: the prompt plus the text so
  far, or, for chat, the partial assistant message continued (`continue_final_message`).
- `Splice` rewrites the continuation's events into the client's stream: the original id,
  no second role header, chat chunks where the continuation is a completion, and a usage
  that counts the whole answer once.
- `strip_token_ids` takes the ids out of events the client did not ask them for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
_FOLD_BYTES = 64 * 1024  # parse and fold held events beyond this, so memory stays bounded
_DONE = b"data: [DONE]\n\n"

# Fields that change what a continuation would have to reproduce beyond plain text
# (tool calls, constrained decoding, log-probabilities, several choices): such a stream
# is not migrated; a break ends it with an error event, as without migration.
_NOT_MIGRATABLE = ("tools", "functions", "logprobs", "top_logprobs", "echo", "suffix",
                   "guided_json", "guided_regex", "guided_choice", "guided_grammar",
                   "structured_outputs")
# Chat-only request fields, left out when a chat continues as a completion over token ids.
_CHAT_ONLY = ("messages", "add_generation_prompt", "continue_final_message", "chat_template",
              "chat_template_kwargs", "documents", "tool_choice", "parallel_tool_calls",
              "response_format", "max_completion_tokens", "reasoning_effort")

# `"token_ids": [...]` or `"prompt_token_ids": ...` with its comma, at any place in an
# object. A quote after `,` or `{` is structural in valid JSON (inside a string it would
# be escaped), so these never match inside string content.
_IDS_AFTER = re.compile(rb',\s*"(?:prompt_)?token_ids"\s*:\s*(?:\[[-0-9,\s]*\]|null)')
# (The brace is matched, and put back, rather than looked behind for: a pattern that starts
# with a literal is searched for at C speed; this runs on every event vLLM streams.)
_IDS_FIRST = re.compile(rb'{\s*"(?:prompt_)?token_ids"\s*:\s*(?:\[[-0-9,\s]*\]|null)\s*,?')


def is_migratable(path: str, body: dict[str, Any]) -> bool:
    """Whether a broken stream of this request may continue elsewhere."""
    if path not in (CHAT_PATH, COMPLETIONS_PATH) or body.get("stream") is not True:
        return False
    if body.get("n") not in (None, 1) or body.get("best_of") not in (None, 1):
        return False
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return False
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list) \
            and len(prompt) != 1:
        return False
    return not any(body.get(k) not in (None, False, 0, [], "") for k in _NOT_MIGRATABLE)


def strip_token_ids(events: bytes) -> bytes:
    """`events` without the token-id fields the router asked for on the client's behalf."""
    if b"token_ids" not in events:
        return events
    return _IDS_FIRST.sub(b"{", _IDS_AFTER.sub(b"", events))


@dataclass(slots=True)
class StreamState:
    """What the client has been sent of one stream."""

    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    has_ids: bool = True  # every output event carried its ids
    prompt_token_ids: list[int] | None = None
    num_outputs: int = 0  # events that carried output
    finish_reason: str | None = None
    is_done: bool = False  # `data: [DONE]` passed
    has_usage: bool = False  # a usage chunk passed
    has_error: bool = False  # an in-band error event passed: the engine ended it
    head: dict[str, Any] = field(default_factory=dict)  # id, created, model of the stream

    @property
    def num_sent_tokens(self) -> int:
        return len(self.token_ids) if self.has_ids else self.num_outputs

    @property
    def has_ended(self) -> bool:
        """Nothing to continue: the answer finished, or the engine reported an error."""
        return self.is_done or self.has_error or self.finish_reason is not None

    def add(self, obj: Any) -> None:
        if not isinstance(obj, dict):
            return
        if "error" in obj:
            self.has_error = True
            return
        if not self.head:
            self.head = {k: obj[k] for k in ("id", "created", "model") if k in obj}
        if isinstance(obj.get("prompt_token_ids"), list):
            self.prompt_token_ids = obj["prompt_token_ids"]
        if isinstance(obj.get("usage"), dict) and not obj.get("choices"):
            self.has_usage = True
        for choice in obj.get("choices") or ():
            self._add_choice(choice)

    def _add_choice(self, choice: dict[str, Any]) -> None:
        delta = choice.get("delta")
        text = (delta.get("content") or "") if isinstance(delta, dict) \
            else (choice.get("text") or "")
        if isinstance(choice.get("prompt_token_ids"), list):
            self.prompt_token_ids = choice["prompt_token_ids"]
        ids = choice.get("token_ids")
        if text or ids:
            self.num_outputs += 1
            self.text += text
            if isinstance(ids, list):
                self.token_ids.extend(ids)
            elif text:
                self.has_ids = False
        if choice.get("finish_reason"):
            self.finish_reason = choice["finish_reason"]


def parse_events(data: bytes) -> list[Any]:
    """The payloads of whole SSE events: decoded JSON, or the string `[DONE]`."""
    out: list[Any] = []
    for event in data.split(b"\n\n"):
        for line in event.split(b"\n"):
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                out.append("[DONE]")
                continue
            try:
                out.append(json.loads(payload))
            except ValueError:
                continue  # not ours to judge; the client got it as it was
    return out


class WholeEvents:
    """Bytes in, whole SSE events out: a partial event waits for the chunk that ends it."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, chunk: bytes) -> bytes:
        data = self._partial + chunk if self._partial else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._partial = data
            return b""
        self._partial = data[end + 2:]
        return data[:end + 2]


class StreamLedger:
    """The client's side of one stream: whole events in, what was sent kept."""

    __slots__ = ("_partial", "_held", "_held_bytes", "_state")

    def __init__(self) -> None:
        self._partial = b""  # the start of an event the next chunk ends (WholeEvents')
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._state = StreamState()

    def feed(self, chunk: bytes) -> bytes:
        """The whole events `chunk` completes, to forward now; a partial one waits.
        (`WholeEvents.feed` and `record` spelled out: this runs for every chunk.)"""
        data = self._partial + chunk if self._partial else chunk
        end = data.rfind(b"\n\n")
        if end < 0:
            self._partial = data
            return b""
        end += 2
        if end == len(data):  # the common case: the chunk ends on an event boundary
            self._partial = b""
            whole = data
        else:
            self._partial = data[end:]
            whole = data[:end]
        self._held.append(whole)
        self._held_bytes += len(whole)
        if self._held_bytes > _FOLD_BYTES:
            self._fold()
        return whole

    def feed_stripped(self, chunk: bytes) -> bytes:
        """`feed`, with the token ids the client did not ask for taken out of what it is
        sent (after recording: a continuation still uses them)."""
        return strip_token_ids(self.feed(chunk))

    def record(self, events: bytes) -> None:
        """Whole events the client is sent (a continuation's, after `Splice`)."""
        self._held.append(events)
        self._held_bytes += len(events)
        if self._held_bytes > _FOLD_BYTES:
            self._fold()

    def state(self) -> StreamState:
        self._fold()
        return self._state

    def _fold(self) -> None:
        for payload in parse_events(b"".join(self._held)):
            if payload == "[DONE]":
                self._state.is_done = True
            else:
                self._state.add(payload)
        self._held.clear()
        self._held_bytes = 0


@dataclass(frozen=True, slots=True)
class Continuation:
    path: str
    body: dict[str, Any]
    as_completion: bool  # a chat continued as a completion over token ids: translate back


def max_tokens_field(body: dict[str, Any]) -> str:
    return "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"


def remaining_tokens(body: dict[str, Any], st: StreamState) -> int | None:
    """What the request may still generate (None: no limit was set)."""
    limit = body.get(max_tokens_field(body))
    if not isinstance(limit, int) or isinstance(limit, bool):
        return None
    return limit - st.num_sent_tokens


def continuation(path: str, body: dict[str, Any], st: StreamState,
                 ask_token_ids: bool) -> Continuation | None:
    """The request that continues a stream broken after `st`, or None when it cannot be
    continued (a token-id prompt without the generated ids)."""
    out = {k: v for k, v in body.items() if k != "kv_transfer_params"}
    if ask_token_ids:
        out["return_token_ids"] = True
    remaining = remaining_tokens(body, st)
    if remaining is not None:
        out[max_tokens_field(body)] = remaining
    if st.num_sent_tokens == 0 and not st.text:  # nothing generated yet: ask again
        return Continuation(path, out, False)
    prompt_ids = st.prompt_token_ids
    if prompt_ids is None and path == COMPLETIONS_PATH:
        prompt_ids = _id_prompt(body.get("prompt"))
    if st.has_ids and prompt_ids is not None:  # token-exact
        if path == CHAT_PATH:
            out = {k: v for k, v in out.items() if k not in _CHAT_ONLY}
            if remaining is not None:
                out["max_tokens"] = remaining
        out["prompt"] = [*prompt_ids, *st.token_ids]
        return Continuation(COMPLETIONS_PATH, out, path == CHAT_PATH)
    if path == COMPLETIONS_PATH:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if not isinstance(prompt, str):
            return None
        out["prompt"] = prompt + st.text
        return Continuation(path, out, False)
    messages = [dict(m) if isinstance(m, dict) else m for m in body.get("messages") or []]
    if body.get("continue_final_message") and messages and isinstance(messages[-1], dict):
        messages[-1]["content"] = (messages[-1].get("content") or "") + st.text
    else:
        messages.append({"role": "assistant", "content": st.text})
    out.update(messages=messages, continue_final_message=True, add_generation_prompt=False)
    return Continuation(path, out, False)


def _id_prompt(prompt: Any) -> list[int] | None:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], list):
        prompt = prompt[0]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return list(prompt)
    return None


class Splice:
    """Rewrites a continuation's events into the client's stream (whole events in)."""

    def __init__(self, st: StreamState, is_chat: bool, as_completion: bool) -> None:
        self._head = st.head
        self._is_chat = is_chat
        self._as_completion = as_completion
        self._sent_before = st.num_sent_tokens
        self._events = WholeEvents()

    def feed(self, chunk: bytes) -> bytes:
        whole = self._events.feed(chunk)
        if not whole:
            return b""
        out = []
        for payload in parse_events(whole):
            if payload == "[DONE]":
                out.append(_DONE)
                continue
            rewritten = self._rewrite(payload)
            if rewritten is not None:
                out.append(sse(rewritten))
        return b"".join(out)

    def _rewrite(self, obj: Any) -> dict[str, Any] | None:
        if not isinstance(obj, dict) or "error" in obj:
            return obj
        obj.update(self._head)
        obj.pop("prompt_token_ids", None)
        if self._is_chat:
            obj["object"] = "chat.completion.chunk"
        usage = obj.get("usage")
        if isinstance(usage, dict):  # count the whole answer: prompt as the client's
            usage["prompt_tokens"] = max(0, usage.get("prompt_tokens", 0) - self._sent_before)
            usage["completion_tokens"] = usage.get("completion_tokens", 0) + self._sent_before
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                details["cached_tokens"] = min(details["cached_tokens"], usage["prompt_tokens"])
        choices = obj.get("choices")
        if not choices:
            return obj
        kept = [c for c in (self._choice(c) for c in choices) if c is not None]
        if not kept and not isinstance(usage, dict):
            return None
        obj["choices"] = kept
        return obj

    def _choice(self, choice: dict[str, Any]) -> dict[str, Any] | None:
        choice.pop("prompt_token_ids", None)
        if self._as_completion:  # a completion chunk, shown as the chat chunk it continues
            text = choice.pop("text", "") or ""
            choice["delta"] = {"content": text} if text else {}
        delta = choice.get("delta")
        if isinstance(delta, dict) and "role" in delta:  # the client had its role header
            del delta["role"]
            if not delta.get("content") and not choice.get("finish_reason") \
                    and not choice.get("token_ids"):
                return None
        return choice


def sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def closing_events(st: StreamState, is_chat: bool, remaining: int | None,
                   include_usage: bool) -> bytes:
    """What ends a stream that broke with nothing left to generate: a finish chunk when
    `max_tokens` ran out before the client saw one, the usage chunk when the client asked
    for it and the prompt's ids say its size, then `[DONE]`."""
    out = b""
    kind = "chat.completion.chunk" if is_chat else "text_completion"
    if st.finish_reason is None and remaining is not None and remaining <= 0:
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": "length"}
        if is_chat:
            choice["delta"] = {}
        else:
            choice["text"] = ""
        out += sse({**st.head, "object": kind, "choices": [choice]})
    if include_usage and st.prompt_token_ids is not None:
        prompt, completion = len(st.prompt_token_ids), st.num_sent_tokens
        out += sse({**st.head, "object": kind, "choices": [], "usage": {
            "prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}})
    return out + _DONE
