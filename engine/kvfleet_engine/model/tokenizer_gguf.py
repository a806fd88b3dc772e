"""Build a byte-level BPE `tokenizers.Tokenizer` from a GGUF file's vocabulary and merges."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

# GGUF token types (gguf.TokenType): CONTROL and USER_DEFINED tokens are matched whole.
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _gpt2() -> Any:
    return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)


def _smollm() -> Any:
    # llama.cpp's "smollm" pre-tokenizer: every digit alone, then GPT-2's split.
    return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), _gpt2()])


def _regex_then_bytes(pattern: str) -> Callable[[], Any]:
    def build() -> Any:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    return build


# GGUF `tokenizer.ggml.pre` -> pre-tokenizer factory.
PRE_TOKENIZERS: dict[str, Callable[[], Any]] = {
    "default": _gpt2,
    "gpt2": _gpt2,
    "smollm": _smollm,
    "llama-bpe": _regex_then_bytes(LLAMA3_SPLIT),
    "llama3": _regex_then_bytes(LLAMA3_SPLIT),
    "qwen2": _regex_then_bytes(QWEN2_SPLIT),
}


def build_gguf_bpe(model: str, pre: str, tokens: list[str], token_types: list[int],
                   merges: list[str]) -> Tokenizer:
    if model != "gpt2":
        raise ValueError(f"GGUF tokenizer model {model!r} is not supported "
                         "(only byte-level BPE 'gpt2')")
    if pre not in PRE_TOKENIZERS:
        raise ValueError(f"GGUF pre-tokenizer {pre!r} is not supported; "
                         f"known: {sorted(PRE_TOKENIZERS)}")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [(a, b) for a, b in (m.split(" ", 1) for m in merges)]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    kinds = list(zip(tokens, token_types, strict=True))
    # Control tokens (<|im_start|>...) are dropped when decoding; user-defined ones are text.
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t, kind in kinds if kind == TOKEN_TYPE_CONTROL])
    tok.add_tokens([AddedToken(t, special=False, normalized=False)
                    for t, kind in kinds if kind == TOKEN_TYPE_USER_DEFINED])
    return tok
