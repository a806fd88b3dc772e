"""The offline API, shaped like vLLM's: `LLM(model=...).generate(prompts, sampling_params)`.

    LLM(model="tiny-random")                            # torch runner, real weights
    LLM(model="smollm2-135m", max_num_seqs=16)          # any EngineConfig field as a kwarg
    LLM(model="cpu-tiny", runner="simulated")           # a cost profile, virtual time

    outputs = llm.generate(["Hello, my name is", ...], SamplingParams(temperature=0.8))
    outputs[0].prompt, outputs[0].outputs[0].text       # as vLLM's RequestOutput
    llm.chat([{"role": "user", "content": "Hi"}])       # a list, one output per conversation

`generate` takes one prompt or a list: text, token ids, or vLLM's `{"prompt": ...}` /
`{"prompt_token_ids": [...]}` dicts; one SamplingParams for all or one per prompt; and
returns one RequestOutput per prompt, in order. `n` > 1 runs n engine requests (ids
`"{index}_{request_id}"`, seeds `seed + index` as vLLM does) and returns n outputs. The
engine computes no log-probabilities, so `cumulative_logprob` and `logprobs` are None.
`use_tqdm` is accepted and ignored: there is no progress bar.

The torch runner and the model registry are imported only when asked for, so the
engine core stays importable without torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any

from kvfleet_engine.core import outputs as core_outputs
from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.sampling_params import SamplingParams

RUNNERS = ("torch", "simulated")
DEFAULT_NUM_BLOCKS = 256
DEFAULT_MAX_MODEL_LEN = 2048
PROMPT_KEYS = frozenset({"prompt", "prompt_token_ids"})

# text; token ids; or vLLM's TextPrompt / TokensPrompt dicts
Prompt = str | Sequence[int] | Mapping[str, Any]
Conversation = list[dict[str, str]]


@dataclass(slots=True)
class CompletionOutput:
    """One sample of one prompt (vLLM's CompletionOutput)."""

    index: int
    text: str  # "" with detokenize=False
    token_ids: list[int]
    cumulative_logprob: float | None  # None: the engine computes no log-probabilities
    logprobs: list[Any] | None
    finish_reason: str | None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None  # the stop token id or stop string; None on EOS

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass(slots=True)
class RequestOutput:
    """One prompt's result (vLLM's RequestOutput); `outputs` holds its n samples."""

    request_id: str
    prompt: str | None  # None for a prompt given as token ids
    prompt_token_ids: list[int]
    prompt_logprobs: list[Any] | None
    outputs: list[CompletionOutput]
    finished: bool
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (first sample)


class LLM:
    def __init__(
        self,
        model: str,
        runner: str = "torch",
        *,
        dtype: str = "float32",
        seed: int | None = None,
        **engine_config: Any,
    ) -> None:
        if runner not in RUNNERS:
            raise ValueError(f"runner must be one of {RUNNERS}, not {runner!r}")
        known = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(engine_config) - known)
        if unknown:
            raise ValueError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        engine_config.setdefault("num_blocks", DEFAULT_NUM_BLOCKS)
        block_size = engine_config.setdefault("block_size", 16)
        capacity = (engine_config["num_blocks"] - 1) * block_size
        if runner == "torch":
            self.engine = self._torch_engine(model, dtype, seed, engine_config, capacity)
        else:
            self.engine = self._simulated_engine(model, seed, engine_config, capacity)
        self.tokenizer = self.engine.tokenizer
        self._next_id = 0

    @staticmethod
    def _torch_engine(
        model: str, dtype: str, seed: int | None, options: dict[str, Any], capacity: int
    ) -> LLMEngine:
        from kvfleet_engine.model import registry
        from kvfleet_engine.runners.torch_runner import TorchRunner

        # vLLM's "auto" takes the checkpoint's dtype; on CPU this engine computes in float32
        loaded = registry.load(model, dtype="float32" if dtype == "auto" else dtype)
        model_len = loaded.config.max_position_embeddings
        options.setdefault("max_model_len", min(model_len, DEFAULT_MAX_MODEL_LEN, capacity))
        config = EngineConfig(**options)
        runner = TorchRunner(loaded.model, config.num_blocks, config.block_size, seed=seed)
        return LLMEngine(config, runner, loaded.tokenizer, loaded.eos_token_ids)

    @staticmethod
    def _simulated_engine(
        profile: str, seed: int | None, options: dict[str, Any], capacity: int
    ) -> LLMEngine:
        from kvfleet_engine.model.tokenizer import ByteTokenizer
        from kvfleet_engine.runners.sim_runner import SimulatedRunner, VirtualClock

        options.setdefault("max_model_len", min(DEFAULT_MAX_MODEL_LEN, capacity))
        config = EngineConfig(**options)
        clock = VirtualClock()
        runner = SimulatedRunner(
            profile,
            num_blocks=config.num_blocks,
            block_size=config.block_size,
            time_mode="virtual",
            clock=clock,
            seed=seed,
        )
        # pseudo tokens are not a language: no EOS, so requests run to max_tokens
        return LLMEngine(config, runner, ByteTokenizer(), eos_token_ids=(), clock=clock)

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: Any = True,
        priority: Sequence[int] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion; one RequestOutput per prompt, in prompt order.
        `priority`: one per prompt, lower runs first (as vLLM's)."""
        batch = [self._parse_prompt(p) for p in _as_batch(prompts)]
        per_prompt = _per_prompt(sampling_params, len(batch))
        priorities = [0] * len(batch) if priority is None else list(priority)
        if len(priorities) != len(batch):
            raise ValueError(f"{len(batch)} prompts but {len(priorities)} priorities")
        return self._run(batch, per_prompt, priorities)

    def chat(
        self,
        messages: Conversation | Sequence[Conversation],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
        *,
        use_tqdm: Any = True,
        add_generation_prompt: bool = True,
    ) -> list[RequestOutput]:
        """One conversation (a list of messages) or a list of them, through the model's
        chat template; one RequestOutput per conversation, whose prompt is the rendered text."""
        if not messages:
            raise ValueError("messages is empty: give one conversation or a list of them")
        conversations: list[Any] = (
            [messages] if isinstance(messages[0], Mapping) else list(messages))
        texts = [
            self.tokenizer.apply_chat_template(c, add_generation_prompt=add_generation_prompt)
            for c in conversations
        ]
        return self.generate(texts, sampling_params, use_tqdm=use_tqdm)

    def _run(
        self,
        batch: list[tuple[str | None, list[int]]],
        per_prompt: list[SamplingParams],
        priorities: list[int],
    ) -> list[RequestOutput]:
        engine = self.engine
        requests: list[tuple[str, list[str]]] = []  # (request id, its samples' engine ids)
        added: list[str] = []
        try:
            for (_, ids), params, prio in zip(batch, per_prompt, priorities, strict=True):
                request_id = str(self._next_id)
                self._next_id += 1
                if params.n == 1:
                    samples = [(request_id, params)]
                else:  # vLLM's fan-out: ids "{index}_{request id}", seeds seed + index
                    samples = [(f"{i}_{request_id}", _sample_params(params, i))
                               for i in range(params.n)]
                for sample_id, sample_params in samples:
                    engine.add_request(sample_id, ids, sample_params, priority=prio)
                    added.append(sample_id)
                requests.append((request_id, [sample_id for sample_id, _ in samples]))
        except BaseException:
            for sample_id in added:  # nothing of a refused batch stays in the engine
                engine.abort_request(sample_id)
            raise
        pending = set(added)
        finals: dict[str, core_outputs.RequestOutput] = {}
        while pending:
            if not engine.has_unfinished_requests():
                raise RuntimeError(f"the engine dropped requests {sorted(pending)}")
            for out in engine.step():
                if out.is_finished and out.request_id in pending:
                    finals[out.request_id] = out
                    pending.discard(out.request_id)
        results = []
        for (text, ids), params, (request_id, sample_ids) in zip(
            batch, per_prompt, requests, strict=True
        ):
            outs = [finals[i] for i in sample_ids]
            results.append(RequestOutput(
                request_id, text, ids, None,
                [self._completion(i, out, params) for i, out in enumerate(outs)],
                True, num_cached_tokens=outs[0].num_cached_tokens))
        return results

    def _completion(
        self, index: int, out: core_outputs.RequestOutput, params: SamplingParams
    ) -> CompletionOutput:
        token_ids = list(out.token_ids)
        return CompletionOutput(
            index, out.text if params.detokenize else "", token_ids, None, None,
            out.finish_reason, self._stop_reason(out.finish_reason, token_ids, out.text, params))

    def _stop_reason(
        self, finish_reason: str | None, token_ids: list[int], text: str, params: SamplingParams
    ) -> int | str | None:
        """What stopped a "stop" finish, as vLLM reports it: the stop token id, the stop
        string (the first found where the text was cut), or None for EOS."""
        if finish_reason != "stop" or not token_ids:
            return None
        last = token_ids[-1]
        if last in params.stop_token_ids:
            return last
        if (not params.ignore_eos and last in self.engine.eos_token_ids) or not params.stop:
            return None
        full = self.tokenizer.decode(token_ids)
        found = [(at, i) for i, s in enumerate(params.stop)
                 if s and (at := full.find(s, len(text))) != -1]
        return params.stop[min(found)[1]] if found else None

    def _parse_prompt(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """(prompt text or None, token ids)."""
        if isinstance(prompt, str):
            return prompt, list(self.tokenizer.encode(prompt))
        if isinstance(prompt, Mapping):
            extra = sorted(set(prompt) - PROMPT_KEYS)
            if extra:
                raise ValueError(f"prompt keys {extra} are not supported; "
                                 f"use {sorted(PROMPT_KEYS)}")
            text = prompt.get("prompt")
            if "prompt_token_ids" in prompt:
                return text, list(prompt["prompt_token_ids"])
            if isinstance(text, str):
                return text, list(self.tokenizer.encode(text))
            raise ValueError("a prompt dict needs a 'prompt' string or 'prompt_token_ids'")
        return None, list(prompt)


def _as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
    if isinstance(prompts, str | Mapping):
        return [prompts]
    items: list[Any] = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [items]  # one prompt given as token ids
    return items


def _per_prompt(
    params: SamplingParams | Sequence[SamplingParams] | None, num_prompts: int
) -> list[SamplingParams]:
    if params is None or isinstance(params, SamplingParams):
        return [params or SamplingParams()] * num_prompts
    per_prompt = list(params)
    if len(per_prompt) != num_prompts:
        raise ValueError(f"{num_prompts} prompts but {len(per_prompt)} sampling params")
    for p in per_prompt:
        if not isinstance(p, SamplingParams):
            raise ValueError(f"sampling params must be SamplingParams, not {type(p).__name__}")
    return per_prompt


def _sample_params(params: SamplingParams, index: int) -> SamplingParams:
    seed = None if params.seed is None else params.seed + index
    return replace(params, n=1, best_of=None, seed=seed)
