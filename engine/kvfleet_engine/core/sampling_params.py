"""Per-request sampling settings, checked once at construction.

The field names and defaults are vLLM's (`max_tokens` 16, `top_k` 0 or -1 off, `top_p` in
(0, 1]), so a vLLM user's `SamplingParams(...)` means the same here. vLLM fields this engine
does not implement are accepted at their neutral value and refused otherwise, with a
ValueError naming the field and why; names vLLM does not have either are a TypeError, as
in vLLM. `n` and `detokenize` are honoured by the offline `LLM` (n samples are n engine
requests); the engine core runs one sample per request and always detokenizes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

NO_LOGPROBS = "the engine does not compute log-probabilities"

# vLLM fields accepted only at their neutral value:
# name -> (the default, is a value neutral?, why any other is refused)
_UNSUPPORTED: dict[str, tuple[Any, Callable[[Any], bool], str]] = {
    "presence_penalty": (0.0, lambda v: v == 0, "penalties are not implemented"),
    "frequency_penalty": (0.0, lambda v: v == 0, "penalties are not implemented"),
    "repetition_penalty": (1.0, lambda v: v == 1, "penalties are not implemented"),
    "min_p": (0.0, lambda v: v == 0, "min-p filtering is not implemented (use top_p or top_k)"),
    "min_tokens": (0, lambda v: v == 0, "a minimum length is not implemented"),
    "logprobs": (None, lambda v: v is None, NO_LOGPROBS),
    "prompt_logprobs": (None, lambda v: v is None, NO_LOGPROBS),
    "skip_special_tokens": (True, bool, "special tokens are always skipped"),
    "spaces_between_special_tokens": (True, bool, "special tokens are always skipped"),
    "include_stop_str_in_output": (False, lambda v: not v, "the text is always cut before a "
                                   "stop string"),
    "logit_bias": (None, lambda v: not v, "logit bias is not implemented"),
    "allowed_token_ids": (None, lambda v: v is None, "restricting the vocabulary is not "
                          "implemented"),
    "bad_words": (None, lambda v: not v, "bad words are not implemented"),
    "logits_processors": (None, lambda v: not v, "logits processors are not implemented"),
    "truncate_prompt_tokens": (None, lambda v: v is None, "prompts are never truncated"),
    "structured_outputs": (None, lambda v: v is None, "structured output is not implemented"),
    "guided_decoding": (None, lambda v: v is None, "guided decoding is not implemented"),
}
_unsupported_values = attrgetter(*_UNSUPPORTED)
_DEFAULTS = tuple(default for default, _, _ in _UNSUPPORTED.values())


@dataclass(slots=True)
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 or -1 means off
    seed: int | None = None
    stop: list[str] = field(default_factory=list)  # a str is taken as [str]
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    n: int = 1  # samples per prompt (the offline LLM; one engine request each)
    best_of: int | None = None  # None or n: no hidden extra samples
    detokenize: bool = True  # False: the offline LLM hands out token ids, no text
    # vLLM's fields this engine does not implement: neutral values only (_UNSUPPORTED)
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    min_p: float = 0.0
    min_tokens: int = 0
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    logits_processors: list[Any] | None = None
    truncate_prompt_tokens: int | None = None
    structured_outputs: Any = None
    guided_decoding: Any = None

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        elif self.stop is None:
            self.stop = []
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {self.max_tokens!r} "
                             "(None, until the context is full, is not supported)")
        if not _is_int(self.n) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if self.best_of not in (None, self.n):
            raise ValueError(f"best_of={self.best_of!r} is not supported: it must be None or "
                             f"equal to n ({self.n}); every sample is returned")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be -1 or 0 (off) or positive, got {self.top_k!r}")
        if self.stop and not self.detokenize:
            raise ValueError("stop strings need detokenize=True")
        if _unsupported_values(self) != _DEFAULTS:  # the common case costs one comparison
            for name, (_, is_neutral, why) in _UNSUPPORTED.items():
                value = getattr(self, name)
                if not is_neutral(value):
                    raise ValueError(f"{name}={value!r} is not supported: {why}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
