"""Shape and hyper-parameters of a Llama-family decoder, independent of where weights come from."""

from __future__ import annotations

from dataclasses import dataclass, field

ROPE_SCALING_KINDS = ("linear", "llama3", "factors")


@dataclass(slots=True)
class RopeScaling:
    """RoPE frequency scaling.

    - linear: positions divided by `factor`.
    - llama3: Llama 3.1's piecewise rescaling of long wavelengths.
    - factors: explicit per-frequency divisors (GGUF's `rope_freqs.weight`).
    """

    kind: str
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192
    freq_factors: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ROPE_SCALING_KINDS:
            raise ValueError(f"unsupported rope scaling {self.kind!r}; "
                             f"use one of {ROPE_SCALING_KINDS}")
        if self.factor <= 0:
            raise ValueError("rope scaling factor must be positive")
        if self.kind == "llama3" and self.high_freq_factor <= self.low_freq_factor:
            raise ValueError("llama3 rope scaling needs high_freq_factor > low_freq_factor")
        if self.kind == "factors" and not self.freq_factors:
            raise ValueError("rope scaling 'factors' needs freq_factors")


@dataclass(slots=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0 means hidden_size // num_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling | None = None
    max_position_embeddings: int = 2048
    is_tied_embedding: bool = False
    is_qkv_biased: bool = False
    extra: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"model config {name} must be positive")
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise ValueError("hidden_size must be divisible by num_heads")
            self.head_dim = self.hidden_size // self.num_heads
        if self.head_dim % 2:
            raise ValueError("head_dim must be even for RoPE")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads (GQA)")
        if self.rms_norm_eps <= 0 or self.rope_theta <= 0:
            raise ValueError("rms_norm_eps and rope_theta must be positive")

    @property
    def num_queries_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V for one token across all layers: 2 x layers x kv_heads x head_dim x bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, num_tokens: int,
                   dtype_bytes: int) -> int:
    """KV-cache size: 2 x layers x kv_heads x head_dim x tokens x dtype bytes."""
    return 2 * num_layers * num_kv_heads * head_dim * num_tokens * dtype_bytes
