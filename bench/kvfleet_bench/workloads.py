"""The engine benchmarks' workloads: prompt and output lengths from the Azure 2023
conversation trace (or fixed), seeded random token ids, and an engine sized for them.

Prompts are seeded random token ids and EOS is ignored, so every engine does the same work.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path
from typing import Any

from kvfleet_bench.procs import REPO_DIR

AZURE_TRACE = REPO_DIR.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"

Items = list[tuple[list[int], int]]  # (prompt token ids, output tokens)


def trace_lengths(path: Path, num: int, seed: int, scale: int = 8,
                  prompt_clip: tuple[int, int] = (16, 512),
                  output_clip: tuple[int, int] = (8, 124)) -> list[tuple[int, int]]:
    with path.open() as f:
        rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
    picked = random.Random(seed).sample(rows, num)

    def clip(x: int, lo_hi: tuple[int, int]) -> int:
        return min(max(x // scale, lo_hi[0]), lo_hi[1])

    return [(clip(p, prompt_clip), clip(o, output_clip)) for p, o in picked]


def random_prompts(lengths: list[tuple[int, int]], vocab_size: int, seed: int) -> Items:
    rng = random.Random(seed)
    lo, hi = (0, min(vocab_size, 256)) if vocab_size < 1000 else (100, vocab_size - 100)
    return [([rng.randrange(lo, hi) for _ in range(p)], o) for p, o in lengths]


def sized_engine(model: Any, items: Items, max_num_seqs: int, batched_tokens: int) -> Any:
    """(LLMEngine, TorchRunner) over `model` with just enough KV blocks for `items`."""
    from kvfleet_engine.core.config import EngineConfig
    from kvfleet_engine.core.engine import LLMEngine
    from kvfleet_engine.runners.torch_runner import TorchRunner

    block_size = 16
    longest = max(len(p) + o for p, o in items)
    per_seq = -(-longest // block_size)
    num_blocks = 1 + min(len(items), max_num_seqs) * per_seq + 8
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=batched_tokens,
                       max_model_len=per_seq * block_size, kv_safety_margin=0.0)
    runner = TorchRunner(model, num_blocks, block_size, seed=0)
    return LLMEngine(cfg, runner), runner
