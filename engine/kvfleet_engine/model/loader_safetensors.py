"""Load an HF Llama-family checkpoint folder: config.json + *.safetensors (+ tokenizer.json)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kvfleet_engine.model.config import ModelConfig, RopeScaling
from kvfleet_engine.model.tokenizer import HFTokenizer

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


class CheckpointError(ValueError):
    """A checkpoint folder this loader cannot use, with the reason."""


@dataclass(slots=True)
class CheckpointContents:
    config: ModelConfig
    tensors: dict[str, torch.Tensor]
    tokenizer: HFTokenizer | None  # None when the folder has no tokenizer.json
    eos_token_ids: list[int]


def rope_scaling_from_hf(raw: dict[str, Any] | None) -> RopeScaling | None:
    if not raw:
        return None
    kind = raw.get("rope_type") or raw.get("type")
    if kind in (None, "default"):
        return None
    if kind == "linear":
        return RopeScaling("linear", factor=float(raw["factor"]))
    if kind == "llama3":
        return RopeScaling(
            "llama3", factor=float(raw["factor"]),
            low_freq_factor=float(raw.get("low_freq_factor", 1.0)),
            high_freq_factor=float(raw.get("high_freq_factor", 4.0)),
            original_max_position_embeddings=int(raw.get("original_max_position_embeddings", 8192)))
    raise CheckpointError(f"rope scaling {kind!r} is not supported (linear, llama3)")


def config_from_hf(raw: dict[str, Any]) -> ModelConfig:
    model_type = raw.get("model_type", "llama")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise CheckpointError(f"model_type {model_type!r} is not supported; "
                              f"supported: {SUPPORTED_MODEL_TYPES}")
    try:
        num_heads = int(raw["num_attention_heads"])
        return ModelConfig(
            vocab_size=int(raw["vocab_size"]), hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_layers=int(raw["num_hidden_layers"]), num_heads=num_heads,
            num_kv_heads=int(raw.get("num_key_value_heads") or num_heads),
            head_dim=int(raw.get("head_dim") or 0),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            rope_scaling=rope_scaling_from_hf(raw.get("rope_scaling")),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            is_tied_embedding=bool(raw.get("tie_word_embeddings", False)),
            is_qkv_biased=bool(raw.get("attention_bias", model_type == "qwen2")))
    except KeyError as exc:
        raise CheckpointError(f"config.json lacks {exc.args[0]!r}") from exc


def _eos_ids(folder: Path, raw: dict[str, Any]) -> list[int]:
    gen_path = folder / "generation_config.json"
    gen = json.loads(gen_path.read_text()) if gen_path.exists() else {}
    eos = gen.get("eos_token_id", raw.get("eos_token_id"))
    if eos is None:
        return []
    return [int(e) for e in eos] if isinstance(eos, list) else [int(eos)]


def load_checkpoint(folder: str | Path) -> CheckpointContents:
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{folder} has no config.json")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {exc}") from exc
    cfg = config_from_hf(raw)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{folder} has no *.safetensors files")
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(load_file(str(f)))
    eos = _eos_ids(folder, raw)
    tokenizer = (HFTokenizer.from_folder(folder, eos)
                 if (folder / "tokenizer.json").is_file() else None)
    if tokenizer is not None and not eos:
        eos = tokenizer.eos_token_ids
    return CheckpointContents(cfg, tensors, tokenizer, eos)
