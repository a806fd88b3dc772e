"""Load a Llama-family GGUF file: config, dequantized weights, BPE tokenizer, chat template.

llama.cpp's converter permutes the rows of Q and K weights so that RoPE rotates adjacent
pairs; this loader undoes that permutation so the model keeps HF's rotate-half RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kvfleet_engine.model.config import ModelConfig, RopeScaling
from kvfleet_engine.model.tokenizer import HFTokenizer
from kvfleet_engine.model.tokenizer_gguf import build_gguf_bpe

SUPPORTED_ARCHITECTURES = ("llama",)

# GGUF tensor names -> HF names; `{i}` is the layer index.
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


class GGUFError(ValueError):
    """A GGUF file this loader cannot use, with the reason."""


@dataclass(slots=True)
class GGUFContents:
    config: ModelConfig
    tensors: dict[str, torch.Tensor]  # HF names, float32
    tokenizer: HFTokenizer
    eos_token_ids: list[int]
    chat_template: str | None


def unpermute_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute` (interleaved pairs back to rotate-half halves)."""
    rows = w.shape[0]
    half = rows // num_heads // 2
    return w.reshape(num_heads, half, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def permute_rows(w: np.ndarray, num_heads: int) -> np.ndarray:
    """llama.cpp's `permute`, as its HF->GGUF converter applies it to Q and K."""
    rows = w.shape[0]
    half = rows // num_heads // 2
    return w.reshape(num_heads, 2, half, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _fields(reader: Any) -> dict[str, Any]:
    return {name: field.contents() for name, field in reader.fields.items()}


def config_from_metadata(meta: dict[str, Any], rope_freqs: np.ndarray | None,
                         has_output: bool, has_qkv_bias: bool) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise GGUFError(f"GGUF architecture {arch!r} is not supported; "
                        f"supported: {SUPPORTED_ARCHITECTURES}")

    def get(key: str, default: Any = None) -> Any:
        value = meta.get(f"{arch}.{key}", default)
        if value is None:
            raise GGUFError(f"GGUF file lacks metadata {arch}.{key}")
        return value

    num_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    head_dim = int(get("attention.key_length", hidden // num_heads))
    scaling = None
    if rope_freqs is not None:
        scaling = RopeScaling("factors", freq_factors=tuple(float(x) for x in rope_freqs))
    elif meta.get(f"{arch}.rope.scaling.type") == "linear":
        scaling = RopeScaling("linear", factor=float(get("rope.scaling.factor")))
    vocab = meta.get(f"{arch}.vocab_size") or len(meta["tokenizer.ggml.tokens"])
    return ModelConfig(
        vocab_size=int(vocab), hidden_size=hidden,
        intermediate_size=int(get("feed_forward_length")), num_layers=int(get("block_count")),
        num_heads=num_heads, num_kv_heads=int(get("attention.head_count_kv", num_heads)),
        head_dim=head_dim, rms_norm_eps=float(get("attention.layer_norm_rms_epsilon")),
        rope_theta=float(get("rope.freq_base", 10000.0)), rope_scaling=scaling,
        max_position_embeddings=int(get("context_length")),
        is_tied_embedding=not has_output, is_qkv_biased=has_qkv_bias)


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    return None


def _reader(path: Path) -> Any:
    from gguf import GGUFReader

    if not path.is_file():
        raise GGUFError(f"GGUF file not found: {path}")
    try:
        return GGUFReader(str(path))
    except Exception as exc:  # the gguf package raises bare ValueError/struct errors
        raise GGUFError(f"cannot read GGUF file {path}: {exc}") from exc


def load_gguf_tokenizer(path: str | Path) -> HFTokenizer:
    """Only the tokenizer (and chat template) of a GGUF file; no weights are read."""
    return _tokenizer(_fields(_reader(Path(path))))[0]


def load_gguf(path: str | Path) -> GGUFContents:
    from gguf.quants import dequantize

    path = Path(path)
    reader = _reader(path)
    meta = _fields(reader)
    raw = {t.name: t for t in reader.tensors}
    rope = raw.get("rope_freqs.weight")
    rope_freqs = None if rope is None else np.asarray(dequantize(rope.data, rope.tensor_type))
    cfg = config_from_metadata(meta, rope_freqs, "output.weight" in raw,
                               any(n.endswith("attn_q.bias") for n in raw))
    tensors: dict[str, torch.Tensor] = {}
    for name, t in raw.items():
        hf = _hf_name(name)
        if hf is None:
            continue
        try:
            w = np.asarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        except NotImplementedError as exc:
            raise GGUFError(f"tensor {name} has unsupported type {t.tensor_type.name}") from exc
        if "self_attn.q_proj" in hf:
            w = unpermute_rows(w, cfg.num_heads)
        elif "self_attn.k_proj" in hf:
            w = unpermute_rows(w, cfg.num_kv_heads)
        tensors[hf] = torch.from_numpy(np.array(w, dtype=np.float32, order="C", copy=True))
    tokenizer, eos = _tokenizer(meta)
    return GGUFContents(cfg, tensors, tokenizer, eos, tokenizer.chat_template)


def _tokenizer(meta: dict[str, Any]) -> tuple[HFTokenizer, list[int]]:
    if "tokenizer.ggml.tokens" not in meta:
        raise GGUFError("GGUF file has no tokenizer vocabulary")
    tok = build_gguf_bpe(str(meta.get("tokenizer.ggml.model", "gpt2")),
                         str(meta.get("tokenizer.ggml.pre", "default")),
                         list(meta["tokenizer.ggml.tokens"]),
                         [int(x) for x in meta.get("tokenizer.ggml.token_type", [])]
                         or [1] * len(meta["tokenizer.ggml.tokens"]),
                         list(meta.get("tokenizer.ggml.merges", [])))
    eos = [int(meta[k]) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")
           if k in meta]
    eos = list(dict.fromkeys(eos))
    bos = meta.get("tokenizer.ggml.bos_token_id")
    template = meta.get("tokenizer.chat_template")
    hf = HFTokenizer(tok, eos, template, None if bos is None else int(bos),
                     bool(meta.get("tokenizer.ggml.add_bos_token", False)))
    return hf, eos
