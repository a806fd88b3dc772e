"""The decoder layer's ops (norms, activation, RoPE, linear): the fused CPU kernels when
they are loaded, plain torch otherwise (paged attention makes the same choice in
paged_attention.py).

Both paths compute in float32 and round to the activation dtype; they agree to within
bf16 rounding. `use_kernels(False)` forces the torch path (tests compare the two). The
kernels read weights as the activation dtype: the model keeps both in one dtype.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F

from kvfleet_engine.model import cpu_kernels
from kvfleet_engine.model.rope import apply_rotary

_forced_off = False


def use_kernels(is_on: bool) -> None:
    global _forced_off
    _forced_off = not is_on


def kernels(x: torch.Tensor) -> ctypes.CDLL | None:
    """The kernel library if it can take this tensor (CPU, float32 or bfloat16)."""
    if _forced_off or x.device.type != "cpu" or x.dtype not in cpu_kernels.DTYPE_CODES:
        return None
    return cpu_kernels.load()


def dtype_code(x: torch.Tensor) -> int:
    return cpu_kernels.DTYPE_CODES[x.dtype]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float,
             residual: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """norm(x) * weight, or with a residual: residual += x in place, norm(residual) * weight.

    Returns (normed, residual); without a residual, x itself is the new residual.
    """
    lib = kernels(x)
    dim = x.shape[-1]
    if lib is None:
        if residual is None:
            residual = x
        else:
            residual.add_(x)
        normed = F.rms_norm(residual.float(), (dim,), eps=eps) * weight.float()
        return normed.to(x.dtype), residual
    x = x.contiguous()
    out = torch.empty_like(x)
    lib.kvf_rms_norm(dtype_code(x), x.data_ptr(), dim,
                     None if residual is None else residual.data_ptr(), weight.data_ptr(),
                     out.data_ptr(), x.numel() // dim, dim, eps)
    return out, x if residual is None else residual


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[n, 2 * inter] (gate, up halves) -> silu(gate) * up, [n, inter]."""
    lib = kernels(gate_up)
    if lib is None:
        gate, up = gate_up.float().chunk(2, dim=-1)
        return (F.silu(gate) * up).to(gate_up.dtype)
    gate_up = gate_up.contiguous()
    inter = gate_up.shape[-1] // 2
    out = gate_up.new_empty(*gate_up.shape[:-1], inter)
    lib.kvf_silu_mul(dtype_code(gate_up), gate_up.data_ptr(), out.data_ptr(),
                     gate_up.numel() // (2 * inter), inter)
    return out


def rotate(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor,
           sin: torch.Tensor) -> torch.Tensor:
    """RoPE ("rotate half") on x [n, heads, dim], with float32 tables [positions, dim / 2].

    The kernel rotates in place and returns x; the torch path returns a new tensor.
    """
    lib = kernels(x)
    n, heads, dim = x.shape
    if lib is None or x.stride(2) != 1 or x.stride(1) != dim:
        c = cos.index_select(0, positions).unsqueeze(1)
        s = sin.index_select(0, positions).unsqueeze(1)
        return apply_rotary(x.float(), c, s).to(x.dtype)
    lib.kvf_rope(dtype_code(x), x.data_ptr(), x.stride(0), n, heads, dim,
                 positions.data_ptr(), cos.data_ptr(), sin.data_ptr())
    return x


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           packed: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias): the kernel's bf16 GEMM when `packed` (weight in its pair-packed
    layout, from PackedWeight) is given, else F.linear."""
    lib = kernels(x)
    if lib is None or packed is None or x.dtype != torch.bfloat16 or x.numel() == 0:
        return F.linear(x, weight, bias)
    n, k = weight.shape
    x = x.contiguous()
    out = x.new_empty(*x.shape[:-1], n)
    lib.kvf_packed_gemm(x.data_ptr(), packed.data_ptr(),
                        None if bias is None else bias.contiguous().data_ptr(), out.data_ptr(),
                        x.numel() // k, n, k)
    return out


class PackedWeight:
    """A bf16 weight in the kernel GEMM's layout: for each 16 output columns and each pair
    of input features, one 64-byte vector. Made on first use and remade when the weight
    changes; it costs the weight's size again in memory. At SmolLM2's shapes this GEMM beats
    F.linear (oneDNN, which reorders the weight on every call) by about 2x at 1-16 rows,
    1.4x at 64 and 1.1x on prefill (bench/engine_kernels.py)."""

    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None
        self._packed: torch.Tensor | None = None

    def get(self, weight: torch.Tensor) -> torch.Tensor | None:
        lib = kernels(weight)
        if (lib is None or weight.dtype != torch.bfloat16 or weight.dim() != 2
                or weight.shape[1] % 2 or not lib.kvf_has_bf16_gemm()):
            return None
        # Inference tensors track no version: made under inference_mode, they are taken as
        # fixed once packed (weights are loaded before serving, not changed during it).
        key = (weight.data_ptr(), 0 if weight.is_inference() else weight._version)
        if key != self._key:
            n, k = weight.shape
            w = weight.detach().contiguous()
            packed = torch.empty(-(-n // 16) * 16 * k, dtype=torch.bfloat16)
            lib.kvf_pack_weight(w.data_ptr(), packed.data_ptr(), n, k)
            self._key, self._packed = key, packed
        return self._packed
