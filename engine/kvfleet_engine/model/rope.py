"""Rotary position embedding (HF "rotate half" layout) with theta and scaling from the config."""

from __future__ import annotations

import math

import torch

from kvfleet_engine.model.config import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling | None) -> torch.Tensor:
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if scaling is None:
        return inv_freq
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "factors":
        factors = torch.tensor(scaling.freq_factors, dtype=torch.float64)
        if factors.numel() != inv_freq.numel():
            raise ValueError(f"rope freq_factors has {factors.numel()} entries, "
                             f"need {inv_freq.numel()}")
        return inv_freq / factors
    return _llama3_scaled(inv_freq, scaling)


def _llama3_scaled(inv_freq: torch.Tensor, s: RopeScaling) -> torch.Tensor:
    # Llama 3.1: long wavelengths slowed by `factor`, short ones kept, a smooth blend between.
    old_len = s.original_max_position_embeddings
    low_freq_wavelen = old_len / s.low_freq_factor
    high_freq_wavelen = old_len / s.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / s.factor, inv_freq)
    smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
    blended = (1 - smooth) * scaled / s.factor + smooth * scaled
    is_medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(is_medium, blended, scaled)


class Rotary:
    """Cos/sin tables, grown on demand, looked up by absolute position."""

    def __init__(self, head_dim: int, theta: float, scaling: RopeScaling | None,
                 num_positions: int = 4096) -> None:
        self.inv_freq = inverse_frequencies(head_dim, theta, scaling)
        self.cos = torch.empty(0)
        self.sin = torch.empty(0)
        self._grow(num_positions)

    def _grow(self, num_positions: int) -> None:
        pos = torch.arange(num_positions, dtype=torch.float64)
        freqs = torch.outer(pos, self.inv_freq)
        self.cos = freqs.cos().float()
        self.sin = freqs.sin().float()

    def covering(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole float32 cos and sin tables [num_positions, head_dim/2], grown to cover
        every position given; rows are looked up by absolute position."""
        needed = int(positions.max()) + 1 if positions.numel() else 0
        if needed > self.cos.shape[0]:
            self._grow(max(needed, 2 * self.cos.shape[0]))
        return self.cos, self.sin


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, heads, head_dim]; pairs (i, i + head_dim/2) rotate together."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
