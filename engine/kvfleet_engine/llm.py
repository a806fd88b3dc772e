"""The offline API: `LLM(model=..., runner=...).generate(prompts, params)`.

    LLM(model="tiny-random")                            # torch runner, real weights
    LLM(model="smollm2-135m", max_num_seqs=16)          # any EngineConfig field as a kwarg
    LLM(model="cpu-tiny", runner="simulated")           # a cost profile, virtual time

The torch runner and the model registry are imported only when asked for, so the
engine core stays importable without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields
from typing import Any

from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.outputs import RequestOutput
from kvfleet_engine.core.sampling_params import SamplingParams

RUNNERS = ("torch", "simulated")
DEFAULT_NUM_BLOCKS = 256
DEFAULT_MAX_MODEL_LEN = 2048

Prompt = str | Sequence[int]


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

        loaded = registry.load(model, dtype=dtype)
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

    def generate(
        self,
        prompts: Prompt | Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts (text or token ids) to completion; final outputs in prompt order."""
        batch = self._as_batch(prompts)
        if params is None or isinstance(params, SamplingParams):
            per_prompt = [params or SamplingParams()] * len(batch)
        else:
            per_prompt = list(params)
            if len(per_prompt) != len(batch):
                raise ValueError(f"{len(batch)} prompts but {len(per_prompt)} sampling params")
        ids = []
        engine = self.engine
        for prompt, p in zip(batch, per_prompt, strict=True):
            request_id = f"llm-{self._next_id}"
            self._next_id += 1
            engine.add_request(request_id, self._token_ids(prompt), p)
            ids.append(request_id)
        finals: dict[str, RequestOutput] = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.is_finished:
                    finals[out.request_id] = out
        return [finals[i] for i in ids]

    def chat(
        self, messages: list[dict[str, str]], params: SamplingParams | None = None
    ) -> RequestOutput:
        """One conversation through the model's chat template."""
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.generate(text, params)[0]

    def _token_ids(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return list(self.tokenizer.encode(prompt))
        return list(prompt)

    @staticmethod
    def _as_batch(prompts: Prompt | Sequence[Prompt]) -> list[Prompt]:
        if isinstance(prompts, str):
            return [prompts]
        items: list[Any] = list(prompts)
        if items and all(isinstance(t, int) for t in items):
            return [items]  # one prompt given as token ids
        return items
