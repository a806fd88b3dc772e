"""Turning sampled tokens into finish decisions and text.

- `check_stop_token`: pure; decides "stop" / "length" from one new token.
- `IncrementalDetokenizer`: per-request text with stop strings. It decodes a short
  window of recent tokens (not the whole output every step), withholds a trailing
  U+FFFD (an incomplete UTF-8 sequence), and withholds the last len(stop)-1 characters
  so a stop string is never streamed in part. On a stop string the text is cut just
  before it and the request finishes with "stop".
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

from kvfleet_engine.core.sampling_params import SamplingParams


class Tokenizer(Protocol):
    """What the engine needs from a tokenizer (duck-typed)."""

    eos_token_ids: Collection[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def check_stop_token(
    token_id: int,
    num_output_tokens: int,
    num_tokens: int,
    params: SamplingParams,
    eos_token_ids: Collection[int],
    max_model_len: int,
) -> str | None:
    """Why the request finishes after appending `token_id`, or None to go on."""
    if token_id in params.stop_token_ids:
        return "stop"
    if not params.ignore_eos and token_id in eos_token_ids:
        return "stop"
    if num_output_tokens >= params.max_tokens or num_tokens >= max_model_len:
        return "length"
    return None


class IncrementalDetokenizer:
    __slots__ = ("_tokenizer", "_ids", "_prefix_offset", "_read_offset", "_stop", "_hold",
                 "text", "num_sent")

    def __init__(self, tokenizer: Tokenizer, stop: list[str]) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self._stop = [s for s in stop if s]
        self._hold = max((len(s) for s in self._stop), default=1) - 1
        self.text = ""  # all text decoded so far (may include withheld characters)
        self.num_sent = 0  # characters already handed out

    def add(self, token_id: int | None, is_final: bool) -> tuple[str, bool]:
        """Add one token (None: nothing to decode, e.g. a stop token); return
        (new text to hand out, whether a stop string ended the request)."""
        if token_id is not None:
            self._ids.append(token_id)
            self._decode_tail(is_final)
        is_stopped = False
        if self._stop:
            is_stopped = self._apply_stop_strings()
        if is_final or is_stopped:
            end = len(self.text)
        else:
            end = max(self.num_sent, len(self.text) - self._hold)
        new_text = self.text[self.num_sent : end]
        self.num_sent = end
        return new_text, is_stopped

    def sent_text(self) -> str:
        return self.text[: self.num_sent]

    def _decode_tail(self, is_final: bool) -> None:
        decode = self._tokenizer.decode
        ids = self._ids
        prefix = decode(ids[self._prefix_offset : self._read_offset])
        full = decode(ids[self._prefix_offset :])
        if len(full) > len(prefix) and (is_final or not full.endswith("\ufffd")):
            self.text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(ids)

    def _apply_stop_strings(self) -> bool:
        # only the unsent tail (plus overlap) can hold a new match
        start = max(0, self.num_sent - self._hold)
        best = -1
        for stop in self._stop:
            idx = self.text.find(stop, start)
            if idx != -1 and (best == -1 or idx < best):
                best = idx
        if best == -1:
            return False
        self.text = self.text[:best]
        if self.num_sent > best:  # cannot happen given the hold-back, but stay consistent
            self.num_sent = best
        return True
