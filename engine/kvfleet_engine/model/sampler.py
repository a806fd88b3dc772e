"""Batched token sampling: greedy, temperature, top-k, top-p, per-request seeds.

A seeded request draws its uniform for output token n from a generator seeded by
(seed, n), so its samples are the same whatever batch it runs in, after preemption by
recompute, or when a prefill replica hands it to a decode replica.
"""

from __future__ import annotations

import torch

from kvfleet_engine.core.sampling_params import SamplingParams

MASK64 = (1 << 64) - 1


def mix_seed(seed: int, offset: int) -> int:
    """splitmix64 of (seed, offset): neighbouring offsets get unrelated streams."""
    z = (seed * 0x9E3779B97F4A7C15 + offset + 1) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return (z ^ (z >> 31)) & ((1 << 63) - 1)


def filtered_probs(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                   top_p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sorted probabilities after temperature, top-k and top-p, with their token ids.

    logits [N, V]; temperature, top_p [N] float; top_k [N] long (0 = off).
    """
    vocab = logits.shape[-1]
    sorted_logits, token_ids = (logits / temperature[:, None]).sort(dim=-1, descending=True)
    rank = torch.arange(vocab)[None, :]
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), vocab)
    sorted_logits = sorted_logits.masked_fill(rank >= k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
    mass_before = probs.cumsum(dim=-1) - probs
    probs = probs.masked_fill(mass_before >= top_p[:, None], 0.0)
    return probs / probs.sum(dim=-1, keepdim=True), token_ids


class Sampler:
    def __init__(self, seed: int | None = None) -> None:
        self._unseeded = torch.Generator()
        if seed is None:
            self._unseeded.seed()
        else:
            self._unseeded.manual_seed(seed)

    def _uniform(self, params: SamplingParams, offset: int) -> torch.Tensor:
        if params.seed is None:
            return torch.rand(1, generator=self._unseeded, dtype=torch.float64)
        gen = torch.Generator().manual_seed(mix_seed(params.seed, offset))
        return torch.rand(1, generator=gen, dtype=torch.float64)

    def sample(self, logits: torch.Tensor, params: list[SamplingParams],
               offsets: list[int]) -> list[int]:
        """logits [N, V] (float32); offsets = output tokens each request already has."""
        tokens = logits.argmax(dim=-1)
        rows = [i for i, p in enumerate(params) if not p.is_greedy]
        if rows:
            sel = torch.tensor(rows)
            chosen = [params[i] for i in rows]
            probs, ids = filtered_probs(
                logits[sel].double(),
                torch.tensor([p.temperature for p in chosen], dtype=torch.float64),
                torch.tensor([max(p.top_k, 0) for p in chosen], dtype=torch.long),
                torch.tensor([p.top_p for p in chosen], dtype=torch.float64))
            u = torch.cat([self._uniform(params[i], offsets[i]) for i in rows])
            cdf = probs.cumsum(dim=-1)
            pick = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None]).clamp(max=cdf.shape[1] - 1)
            tokens[sel] = ids.gather(1, pick).flatten()
        return tokens.tolist()
