"""Tokenizers: byte-level (tests), and BPE via `tokenizers` (tokenizer.json or GGUF vocab).

All share the duck type the engine uses: encode, decode, eos_token_ids, apply_chat_template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvfleet_engine.model.chat_template import render_chat


class ByteTokenizer:
    """UTF-8 bytes are tokens 0-255; a few special ids follow."""

    BOS, EOS, PAD = 256, 257, 258
    VOCAB_SIZE = 260

    def __init__(self, chat_template: str | None = None) -> None:
        self.chat_template = chat_template
        self.eos_token_ids = [self.EOS]
        self.vocab_size = self.VOCAB_SIZE

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int]) -> str:
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: Any, add_generation_prompt: bool = True) -> str:
        return render_chat(self.chat_template, messages, add_generation_prompt)


class HFTokenizer:
    """A `tokenizers.Tokenizer` plus the model's special ids and chat template."""

    def __init__(self, tokenizer: Any, eos_token_ids: list[int], chat_template: str | None = None,
                 bos_token_id: int | None = None, is_bos_added: bool = False) -> None:
        self._tok = tokenizer
        self.eos_token_ids = list(eos_token_ids)
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.is_bos_added = is_bos_added and bos_token_id is not None
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)

    def _token(self, token_id: int | None) -> str:
        return "" if token_id is None else (self._tok.id_to_token(token_id) or "")

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self._tok.encode(text, add_special_tokens=False).ids
        if self.is_bos_added and self.bos_token_id is not None:
            ids = [self.bos_token_id, *ids]
        return ids

    def decode(self, ids: list[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def apply_chat_template(self, messages: Any, add_generation_prompt: bool = True) -> str:
        eos = self.eos_token_ids[0] if self.eos_token_ids else None
        return render_chat(self.chat_template, messages, add_generation_prompt,
                           bos_token=self._token(self.bos_token_id), eos_token=self._token(eos))

    @classmethod
    def from_folder(cls, folder: Path, eos_token_ids: list[int]) -> HFTokenizer:
        """tokenizer.json (+ tokenizer_config.json for the chat template and BOS)."""
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        cfg_path = folder / "tokenizer_config.json"
        cfg: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: take the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        bos = cfg.get("bos_token")
        bos_text = bos.get("content") if isinstance(bos, dict) else bos
        bos_id = tok.token_to_id(bos_text) if bos_text else None
        if not eos_token_ids:
            eos = cfg.get("eos_token")
            eos_text = eos.get("content") if isinstance(eos, dict) else eos
            eos_id = tok.token_to_id(eos_text) if eos_text else None
            eos_token_ids = [eos_id] if eos_id is not None else []
        return cls(tok, eos_token_ids, template, bos_id, bool(cfg.get("add_bos_token", False)))
