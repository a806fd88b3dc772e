"""Naive reference forward: one sequence at a time, no KV cache, no paging, no batching.

Every step recomputes the whole sequence with plain causal attention written out by
hand, so the paged, batched engine can be checked against it token for token.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch

from kvfleet_engine.model.llama import LlamaModel


def naive_causal_attention(layer_idx: int, q: torch.Tensor, k: torch.Tensor,
                           v: torch.Tensor) -> torch.Tensor:
    """q: [T, h, d]; k, v: [T, kv_h, d]; each token sees itself and earlier ones."""
    del layer_idx
    num_tokens, num_heads, head_dim = q.shape
    repeat = num_heads // k.shape[1]
    k = k.repeat_interleave(repeat, dim=1)
    v = v.repeat_interleave(repeat, dim=1)
    scores = torch.einsum("thd,shd->hts", q.float(), k.float()) / math.sqrt(head_dim)
    future = torch.ones(num_tokens, num_tokens, dtype=torch.bool).triu(1)
    probs = scores.masked_fill(future, float("-inf")).softmax(dim=-1)
    return torch.einsum("hts,shd->thd", probs, v.float()).to(q.dtype)


@torch.inference_mode()
def reference_next_logits(model: LlamaModel, token_ids: list[int]) -> torch.Tensor:
    """Logits [vocab] for the token after `token_ids`."""
    ids = torch.tensor(token_ids, dtype=torch.long)
    hidden = model(ids, torch.arange(len(token_ids)), naive_causal_attention)
    return model.compute_logits(hidden[-1:])[0]


def reference_greedy(model: LlamaModel, prompt_ids: list[int], max_tokens: int,
                     eos_token_ids: Iterable[int] = ()) -> list[int]:
    """Greedy continuation of one prompt, stopping after max_tokens or at an EOS id."""
    eos = set(eos_token_ids)
    tokens = list(prompt_ids)
    out: list[int] = []
    for _ in range(max_tokens):
        nxt = int(reference_next_logits(model, tokens).argmax())
        out.append(nxt)
        tokens.append(nxt)
        if nxt in eos:
            break
    return out
