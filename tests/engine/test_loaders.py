"""GGUF and safetensors loaders, checked by writing a known model out and reading it back."""

import json

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize
from kvfleet_engine.model.loader_gguf import GGUFError, load_gguf, permute_rows, unpermute_rows
from kvfleet_engine.model.loader_safetensors import CheckpointError, load_checkpoint
from kvfleet_engine.model.reference import reference_next_logits
from kvfleet_engine.model.registry import ModelNotFoundError, load
from kvfleet_engine.model.tiny import build_tiny_random, tiny_config
from kvfleet_engine.model.weights import WeightError, to_hf_tensors
from safetensors.torch import save_file

Q = gguf.GGMLQuantizationType
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119]
HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight":
    "ffn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight":
    "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight":
    "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight":
    "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}


def _byte_level_vocab() -> list[str]:
    # GPT-2's bytes_to_unicode: every byte maps to a printable character.
    keep = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    table, extra = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def _gguf_name(hf: str) -> str:
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{HF_TO_GGUF[rest]}"


def write_gguf(path, model, qtype):
    """Write `model` as llama.cpp's converter does: Q/K rows permuted, 2-D weights quantized."""
    cfg = model.config
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg.num_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(_byte_level_vocab() + ["<bos>", "<eos>", "<pad>", "<unused>"])
    w.add_token_types([1] * 256 + [3] * 4)
    w.add_token_merges([])
    w.add_eos_token_id(257)
    w.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    expected = {}
    for name, t in to_hf_tensors(model).items():
        arr = t.float().numpy()
        if "q_proj" in name:
            arr = permute_rows(arr, cfg.num_heads)
        elif "k_proj" in name:
            arr = permute_rows(arr, cfg.num_kv_heads)
        kind = qtype if arr.ndim == 2 else Q.F32
        data = quantize(arr, kind)
        w.add_tensor(_gguf_name(name), data, raw_dtype=kind)
        back = dequantize(data, kind)  # what a correct loader must produce, un-permuted
        if "q_proj" in name:
            back = unpermute_rows(back, cfg.num_heads)
        elif "k_proj" in name:
            back = unpermute_rows(back, cfg.num_kv_heads)
        expected[name] = torch.from_numpy(np.array(back, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return expected


def test_permutation_round_trips_and_moves_rows():
    w = np.arange(12 * 3, dtype=np.float32).reshape(12, 3)
    p = permute_rows(w, num_heads=2)
    assert not np.array_equal(p, w)
    assert np.array_equal(unpermute_rows(p, 2), w)
    # llama.cpp interleaves the two rotate-half halves of each head: rows 0,3,1,4,2,5.
    assert p[:, 0].tolist()[:6] == [0, 9, 3, 12, 6, 15]


def test_gguf_f32_round_trip_gives_identical_logits(tmp_path):
    model = build_tiny_random(seed=0, config=tiny_config(is_tied_embedding=False))
    write_gguf(tmp_path / "m.gguf", model, Q.F32)
    loaded = load(str(tmp_path / "m.gguf"))
    assert loaded.config.num_kv_heads == 2 and not loaded.config.is_tied_embedding
    assert loaded.eos_token_ids == [257]
    assert torch.allclose(reference_next_logits(loaded.model, PROMPT),
                          reference_next_logits(model, PROMPT), atol=1e-5)
    assert loaded.tokenizer.decode(loaded.tokenizer.encode("héllo")) == "héllo"
    assert loaded.tokenizer.apply_chat_template([{"role": "user", "content": "x"}]) == "x"


@pytest.mark.parametrize("qtype", [Q.F16, Q.Q8_0, Q.Q4_0, Q.Q4_1])
def test_gguf_quantized_tensors_dequantize_exactly(tmp_path, qtype):
    model = build_tiny_random(seed=1, config=tiny_config(is_tied_embedding=True))
    expected = write_gguf(tmp_path / "m.gguf", model, qtype)
    contents = load_gguf(tmp_path / "m.gguf")
    assert contents.config.is_tied_embedding and set(contents.tensors) == set(expected)
    for name, t in expected.items():
        assert torch.equal(contents.tensors[name], t), name


@pytest.mark.parametrize("content, message", [
    (None, "not found"), (b"not a gguf file at all", "cannot read GGUF"),
])
def test_gguf_bad_files(tmp_path, content, message):
    path = tmp_path / "bad.gguf"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(GGUFError, match=message):
        load_gguf(path)


def test_gguf_unsupported_architecture(tmp_path):
    w = gguf.GGUFWriter(str(tmp_path / "x.gguf"), "mamba")
    w.add_tensor("token_embd.weight", np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(GGUFError, match="architecture 'mamba'"):
        load_gguf(tmp_path / "x.gguf")


HF_CONFIG = {"model_type": "llama", "vocab_size": 260, "hidden_size": 64,
             "intermediate_size": 160, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
             "max_position_embeddings": 4096, "tie_word_embeddings": False, "eos_token_id": 257}


def _write_folder(folder, model, config=HF_CONFIG, drop=None):
    tensors = to_hf_tensors(model)
    if drop:
        tensors.pop(drop)
    half = len(tensors) // 2  # two shards, as large checkpoints come
    items = sorted(tensors.items())
    save_file(dict(items[:half]), str(folder / "model-00001-of-00002.safetensors"))
    save_file(dict(items[half:]), str(folder / "model-00002-of-00002.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))


def test_safetensors_folder_round_trip(tmp_path):
    model = build_tiny_random(seed=2)
    _write_folder(tmp_path, model)
    loaded = load(str(tmp_path))
    assert loaded.eos_token_ids == [257]
    assert torch.equal(reference_next_logits(loaded.model, PROMPT),
                       reference_next_logits(model, PROMPT))


def test_safetensors_llama3_rope_and_bias(tmp_path):
    cfg = dict(HF_CONFIG, model_type="qwen2", rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64})
    contents_cfg = load_checkpoint_config(tmp_path, cfg)
    assert contents_cfg.rope_scaling is not None and contents_cfg.rope_scaling.kind == "llama3"
    assert contents_cfg.is_qkv_biased


def load_checkpoint_config(folder, cfg):
    model = build_tiny_random(seed=2, config=tiny_config(is_qkv_biased=True))
    _write_folder(folder, model, cfg)
    return load_checkpoint(folder).config


@pytest.mark.parametrize("mutate, error, message", [
    (lambda f: (f / "config.json").unlink(), CheckpointError, "no config.json"),
    (lambda f: (f / "config.json").write_text("{oops"), CheckpointError, "not valid JSON"),
    (lambda f: (f / "config.json").write_text(json.dumps(dict(HF_CONFIG, model_type="gpt2"))),
     CheckpointError, "model_type 'gpt2'"),
    (lambda f: (f / "config.json").write_text(json.dumps(dict(HF_CONFIG, hidden_size=32))),
     WeightError, "shape"),
    (lambda f: (f / "config.json").write_text(
        json.dumps(dict(HF_CONFIG, rope_scaling={"type": "yarn", "factor": 2}))),
     CheckpointError, "rope scaling 'yarn'"),
    (lambda f: [p.unlink() for p in f.glob("*.safetensors")], CheckpointError, "safetensors"),
])
def test_safetensors_bad_folders(tmp_path, mutate, error, message):
    _write_folder(tmp_path, build_tiny_random(seed=2))
    mutate(tmp_path)
    with pytest.raises(error, match=message):
        load_checkpoint(tmp_path) if error is CheckpointError else load(str(tmp_path))


def test_missing_tensor_is_named(tmp_path):
    _write_folder(tmp_path, build_tiny_random(seed=2), drop="model.layers.1.mlp.up_proj.weight")
    with pytest.raises(WeightError, match="model.layers.1.mlp.up_proj.weight"):
        load(str(tmp_path))


def test_registry_rejects_unknown_names_and_dtypes(tmp_path):
    with pytest.raises(ModelNotFoundError, match="unknown model 'nope'"):
        load("nope")
    with pytest.raises(ModelNotFoundError, match="unknown model"):
        load(str(tmp_path))  # a folder without config.json
    with pytest.raises(ValueError, match="unknown dtype"):
        load("tiny-random", dtype="int3")
    tiny = load("tiny-random", dtype="bfloat16")
    assert tiny.model.dtype == torch.bfloat16 and tiny.eos_token_ids == [257]
