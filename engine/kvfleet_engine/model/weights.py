"""Install HF-named Llama tensors into a LlamaModel (fusing q/k/v and gate/up)."""

from __future__ import annotations

import torch

from kvfleet_engine.model.llama import DecoderLayer, LlamaModel


class WeightError(ValueError):
    """A checkpoint is missing a tensor or has one of the wrong shape."""


def load_hf_weights(model: LlamaModel, tensors: dict[str, torch.Tensor]) -> None:
    """Copy tensors named as in HF's LlamaForCausalLM into `model` (cast to its dtype)."""
    cfg = model.config

    def take(name: str) -> torch.Tensor:
        if name not in tensors:
            raise WeightError(f"checkpoint lacks tensor {name!r}")
        return tensors[name]

    def put(param: torch.Tensor, value: torch.Tensor, name: str) -> None:
        if tuple(param.shape) != tuple(value.shape):
            raise WeightError(f"tensor {name!r} has shape {tuple(value.shape)}, "
                              f"expected {tuple(param.shape)}")
        with torch.no_grad():
            param.copy_(value.to(param.dtype))

    put(model.embed_tokens.weight, take("model.embed_tokens.weight"), "model.embed_tokens.weight")
    put(model.norm.weight, take("model.norm.weight"), "model.norm.weight")
    if model.lm_head is not None:
        put(model.lm_head.weight, take("lm_head.weight"), "lm_head.weight")
    for i, module in enumerate(model.layers):
        layer: DecoderLayer = module  # type: ignore[assignment]
        p = f"model.layers.{i}."
        put(layer.input_norm.weight, take(p + "input_layernorm.weight"), p + "input_layernorm")
        put(layer.post_norm.weight, take(p + "post_attention_layernorm.weight"),
            p + "post_attention_layernorm")
        qkv = torch.cat([take(p + f"self_attn.{x}_proj.weight") for x in "qkv"])
        put(layer.qkv_proj.weight, qkv, p + "self_attn.qkv_proj.weight")
        if cfg.is_qkv_biased:
            bias = torch.cat([take(p + f"self_attn.{x}_proj.bias") for x in "qkv"])
            put(layer.qkv_proj.bias, bias, p + "self_attn.qkv_proj.bias")
        put(layer.o_proj.weight, take(p + "self_attn.o_proj.weight"), p + "self_attn.o_proj")
        gate_up = torch.cat([take(p + "mlp.gate_proj.weight"), take(p + "mlp.up_proj.weight")])
        put(layer.gate_up_proj.weight, gate_up, p + "mlp.gate_up_proj.weight")
        put(layer.down_proj.weight, take(p + "mlp.down_proj.weight"), p + "mlp.down_proj")


def to_hf_tensors(model: LlamaModel) -> dict[str, torch.Tensor]:
    """The inverse of load_hf_weights: HF-named tensors (q/k/v and gate/up split again)."""
    cfg = model.config
    out = {"model.embed_tokens.weight": model.embed_tokens.weight,
           "model.norm.weight": model.norm.weight}
    if model.lm_head is not None:
        out["lm_head.weight"] = model.lm_head.weight
    q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    for i, module in enumerate(model.layers):
        layer: DecoderLayer = module  # type: ignore[assignment]
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = layer.input_norm.weight
        out[p + "post_attention_layernorm.weight"] = layer.post_norm.weight
        q, k, v = layer.qkv_proj.weight.split((q_size, kv_size, kv_size))
        out.update({p + "self_attn.q_proj.weight": q, p + "self_attn.k_proj.weight": k,
                    p + "self_attn.v_proj.weight": v})
        if cfg.is_qkv_biased:
            qb, kb, vb = layer.qkv_proj.bias.split((q_size, kv_size, kv_size))
            out.update({p + "self_attn.q_proj.bias": qb, p + "self_attn.k_proj.bias": kb,
                        p + "self_attn.v_proj.bias": vb})
        out[p + "self_attn.o_proj.weight"] = layer.o_proj.weight
        gate, up = layer.gate_up_proj.weight.chunk(2)
        out.update({p + "mlp.gate_proj.weight": gate, p + "mlp.up_proj.weight": up,
                    p + "mlp.down_proj.weight": layer.down_proj.weight})
    return {k: v.detach().contiguous().clone() for k, v in out.items()}
