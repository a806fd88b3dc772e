"""How long a step takes on some hardware, from a profile: a roofline in a few numbers.

    t = overhead_s
      + max(floor_s, prefill_s_per_token * prefill_tokens + decode_s_per_seq * decodes
                     + prefill_s_per_pair * prefill_pairs)
      + s_per_kv_token * kv_tokens_read

- prefill_tokens: tokens of prompt chunks this step (prefix-cache hits are never in a
  chunk, so these are the uncached tokens);
- decodes: sequences computing one token after having generated output;
- prefill_pairs: (query, key) pairs of prompt chunks, sum of n*start + n*(n+1)/2: the
  compute-bound part of prefill attention, which grows with the square of a chunk;
- kv_tokens_read: the context each sequence attends over (positions up to its last
  token), the memory-bound part of attention;
- floor_s: streaming the weights once, the least any step costs (memory bound);
- overhead_s: fixed per-step cost (scheduling, launches, sampling).

Profiles are JSON files in `profiles/`, each with a `source` saying where the numbers
come from. Pure functions; no I/O outside `load_profile`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any

from kvfleet_engine.core.runner_base import StepBatch


@dataclass(slots=True)
class CostProfile:
    name: str
    overhead_s: float
    floor_s: float
    prefill_s_per_token: float
    decode_s_per_seq: float
    s_per_kv_token: float
    prefill_s_per_pair: float = 0.0
    num_gpu_blocks: int = 1024  # suggested KV capacity for this hardware and model
    block_size: int = 16
    vocab_size: int = 32000
    model: dict[str, Any] = field(default_factory=dict)  # layers, kv heads, head dim, dtype
    source: str = ""

    def __post_init__(self) -> None:
        for name in ("overhead_s", "floor_s", "prefill_s_per_token", "decode_s_per_seq",
                     "s_per_kv_token", "prefill_s_per_pair"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or value < 0:
                raise ValueError(f"profile {self.name!r}: {name} must be a number >= 0")
        if self.num_gpu_blocks < 2 or self.block_size < 1 or self.vocab_size < 2:
            raise ValueError(
                f"profile {self.name!r}: num_gpu_blocks, block_size or vocab_size is too small"
            )


def step_time(profile: CostProfile, batch: StepBatch) -> float:
    """Seconds one step of `batch` takes under `profile`."""
    num_prefill = 0
    num_pairs = 0
    num_decode = 0
    num_kv = 0
    for seq in batch.seqs:
        n = len(seq.token_ids)
        if n == 1 and seq.num_output_tokens > 0:
            num_decode += 1
        else:
            num_prefill += n
            num_pairs += n * seq.start_pos + n * (n + 1) // 2
        num_kv += seq.start_pos + n
    compute = (
        profile.prefill_s_per_token * num_prefill
        + profile.decode_s_per_seq * num_decode
        + profile.prefill_s_per_pair * num_pairs
    )
    return profile.overhead_s + max(profile.floor_s, compute) + profile.s_per_kv_token * num_kv


def list_profiles() -> list[str]:
    folder = resources.files("kvfleet_engine.runners") / "profiles"
    return sorted(
        p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json")
    )


def load_profile(name_or_path: str) -> CostProfile:
    """A shipped profile by name (e.g. "cpu-tiny"), or a JSON file by path."""
    if name_or_path.endswith(".json"):
        text = Path(name_or_path).read_text()
    else:
        resource = resources.files("kvfleet_engine.runners") / "profiles" / f"{name_or_path}.json"
        if not resource.is_file():
            raise ValueError(
                f"unknown cost profile {name_or_path!r}; known: {', '.join(list_profiles())}"
            )
        text = resource.read_text()
    data = json.loads(text)
    known = {f.name for f in fields(CostProfile)}
    unknown = set(data) - known - {"notes"}
    if unknown:
        raise ValueError(f"profile {name_or_path!r}: unknown keys {sorted(unknown)}")
    return CostProfile(**{k: v for k, v in data.items() if k in known})
