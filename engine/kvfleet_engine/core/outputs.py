"""What `LLMEngine.step()` hands back, and the engine's counters."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvfleet_engine.core.sequence import RequestTiming


class RequestOutput:
    """One request's progress in one step.

    `token_ids` is all output so far. It is a snapshot taken lazily: the engine only
    ever appends to a request's output list, so slicing it to this step's length later
    (even from another thread) gives exactly the tokens known at this step.
    `timing` is the request's live RequestTiming: each field is set once, when it
    happens, except last_token_time.
    """

    __slots__ = (
        "request_id",
        "new_token_ids",
        "_all_output",
        "_num_output",
        "new_text",
        "_text_src",
        "_text_len",
        "is_finished",
        "finish_reason",
        "num_prompt_tokens",
        "num_cached_tokens",
        "timing",
    )

    def __init__(
        self,
        request_id: str,
        new_token_ids: list[int],
        all_output: list[int],
        new_text: str,
        text_src: str,
        text_len: int,
        is_finished: bool,
        finish_reason: str | None,
        num_prompt_tokens: int,
        num_cached_tokens: int,
        timing: RequestTiming,
    ) -> None:
        # positional and logic-free: the engine builds one per running request per step
        self.request_id = request_id
        self.new_token_ids = new_token_ids
        self._all_output = all_output
        self._num_output = len(all_output)
        self.new_text = new_text
        self._text_src = text_src  # str is immutable: its first text_len chars never change
        self._text_len = text_len
        self.is_finished = is_finished
        self.finish_reason = finish_reason  # "stop" | "length" | "abort" | None
        self.num_prompt_tokens = num_prompt_tokens
        self.num_cached_tokens = num_cached_tokens
        self.timing = timing

    @property
    def token_ids(self) -> list[int]:
        return self._all_output[: self._num_output]

    @property
    def num_output_tokens(self) -> int:
        return self._num_output

    @property
    def text(self) -> str:
        """All text handed out so far (empty without a tokenizer)."""
        return self._text_src[: self._text_len]

    def __repr__(self) -> str:
        return (
            f"RequestOutput({self.request_id!r}, new={self.new_token_ids}, "
            f"n={self._num_output}, finished={self.is_finished}, reason={self.finish_reason})"
        )


@dataclass(slots=True)
class StepTimings:
    """Wall-clock split of engine steps (time.perf_counter, never the injected clock)."""

    num_steps: int = 0
    schedule_s: float = 0.0  # scheduler + building the batch
    execute_s: float = 0.0  # runner.execute (the forward pass, or the simulated sleep)
    postprocess_s: float = 0.0  # token bookkeeping, stop checks, detokenizing, outputs
    last_schedule_s: float = 0.0
    last_execute_s: float = 0.0
    last_postprocess_s: float = 0.0
    last_num_seqs: int = 0
    last_num_tokens: int = 0

    def snapshot(self) -> StepTimings:
        return StepTimings(
            self.num_steps, self.schedule_s, self.execute_s, self.postprocess_s,
            self.last_schedule_s, self.last_execute_s, self.last_postprocess_s,
            self.last_num_seqs, self.last_num_tokens,
        )

    @property
    def overhead_fraction(self) -> float:
        """(schedule + postprocess) / total over all steps; 0 before the first step."""
        total = self.schedule_s + self.execute_s + self.postprocess_s
        return 0.0 if total == 0 else (self.schedule_s + self.postprocess_s) / total


@dataclass(slots=True)
class EngineStats:
    num_running: int
    num_waiting: int
    kv_usage: float  # 0-1
    prefix_cache_queries: int  # tokens, cumulative
    prefix_cache_hits: int  # tokens, cumulative
    num_preemptions: int  # cumulative
    num_waiting_prompt_tokens: int  # uncached prompt tokens queued
    num_gpu_blocks: int
    block_size: int
    num_held: int = 0  # finished requests whose KV is held for transfer
    num_prompt_tokens: int = 0  # cumulative, computed prompt tokens of admitted requests
    num_generation_tokens: int = 0  # cumulative
    timings: StepTimings = field(default_factory=StepTimings)
