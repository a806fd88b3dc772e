"""Token ids for text prompts, so that they too can use the precise prefix index.

The precise index (prefix_index.PreciseKVIndex) holds the token-id blocks the engines report
in their KV events. A text prompt matches them only if the router tokenizes it exactly as
the engine will prefill it: the pool model's own tokenizer.json, the chat template from
tokenizer_config.json rendered by the engine's own renderer
(kvfleet_engine.contract.chat_template), and the engine's rule for special tokens. One token
off anywhere and no block matches, so anything the router cannot reproduce (tools, a
per-request template, `continue_final_message`, a list of several prompts) stays on the
approximate index, as does every text prompt when no tokenizer is configured.

    tt = TextTokens()
    tt.configure(cfg.prefix.tokenizer)     # on every config apply; (re)loads on a change
    tt.wanted(endpoints, block_sizes)      # a precise endpoint with a known block size?
    fut = tt.offload(info, endpoints, block_sizes)  # large prompts: on a thread; await
                                           # asyncio.wrap_future(fut) (the HTTP front)
    tt.ids(info, endpoints, block_sizes)   # cached on `info`; None: approximate index only

Errors never fail a request or a config push: a tokenizer that does not load (missing
folder, bad JSON, a template that does not compile) is logged once per setting and text
prompts keep the approximate index (`tt.error` says why); a conversation the template
refuses is left to the engine, which answers it with a 400.

Cost: a fast (Rust) tokenizer still spends about 0.3 us per prompt character, so a 4 KiB
prompt costs ~1 ms of router CPU. Prompts longer than `offload_chars` are tokenized on a
thread with `encode_batch`, which releases the GIL (plain `encode` holds it), so the event
loop keeps serving while they are; shorter ones inline, where a thread hop would cost more
than it saves. Only requests that some precise endpoint could serve are tokenized.
"""

from __future__ import annotations

import json
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from kvfleet_engine.contract.chat_template import (
    ChatTemplateError,
    compile_template,
    render_chat,
)

from kvfleet_router.config import TokenizerConfig
from kvfleet_router.endpoint import EndpointState
from kvfleet_router.request_info import RequestInfo

log = logging.getLogger(__name__)

# Chat request fields that change the rendered prompt in ways the router does not follow.
_CHAT_UNFOLLOWED = ("tools", "chat_template", "chat_template_kwargs", "documents")


class TokenizerLoadError(ValueError):
    """The configured tokenizer folder cannot be used; the message says why."""


class ModelTokenizer:
    """tokenizer.json + tokenizer_config.json, read the way the engine's loader reads them
    (kvfleet_engine.model.tokenizer.HFTokenizer.from_folder)."""

    def __init__(self, folder: str | Path) -> None:
        from tokenizers import Tokenizer

        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise TokenizerLoadError(f"{path} not found")
        try:
            self.tok = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust side raises bare Exception on a bad file
            raise TokenizerLoadError(f"{path} cannot be loaded: {exc}") from None
        cfg = _read_json(folder / "tokenizer_config.json")
        template = cfg.get("chat_template")
        if isinstance(template, list):  # named templates: the default one (as the engine)
            template = next((t.get("template") for t in template
                             if isinstance(t, dict) and t.get("name") == "default"), None)
        self.chat_template: str | None = template if isinstance(template, str) else None
        if self.chat_template is not None:
            try:
                compile_template(self.chat_template)
            except ChatTemplateError as exc:
                raise TokenizerLoadError(f"{folder / 'tokenizer_config.json'}: {exc}") from None
        self.bos_token = self._special(cfg.get("bos_token"))
        self.bos_id = self.tok.token_to_id(self.bos_token) if self.bos_token else None
        self.is_bos_added = bool(cfg.get("add_bos_token", False)) and self.bos_id is not None
        eos_ids = _eos_ids(folder)  # the engine's loader prefers these to the config's
        self.eos_token = (self.tok.id_to_token(eos_ids[0]) or "") if eos_ids \
            else self._special(cfg.get("eos_token"))

    @staticmethod
    def _special(value: Any) -> str:
        text = value.get("content") if isinstance(value, dict) else value
        return text if isinstance(text, str) else ""

    def render(self, messages: Any, add_generation_prompt: bool) -> str:
        return render_chat(self.chat_template, messages, add_generation_prompt,
                           bos_token=self.bos_token, eos_token=self.eos_token)

    def encode(self, text: str, hf_special: bool = False, batch: bool = False) -> list[int]:
        """The engine's ids for `text`. kvfleet's engine: no post-processor, BOS when
        tokenizer_config says `add_bos_token`; vLLM (`hf_special`): the tokenizer's own
        special tokens. `batch`: encode_batch, which releases the GIL (for a thread)."""
        if batch:
            ids: list[int] = self.tok.encode_batch([text], add_special_tokens=hf_special)[0].ids
        else:
            ids = self.tok.encode(text, add_special_tokens=hf_special).ids
        if not hf_special and self.is_bos_added and self.bos_id is not None:
            ids = [self.bos_id, *ids]
        return ids


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"{path} is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise TokenizerLoadError(f"{path} is not a JSON object")
    return data


def _eos_ids(folder: Path) -> list[int]:
    """generation_config.json's, else config.json's eos_token_id (the engine's order)."""
    for name in ("generation_config.json", "config.json"):
        eos = _read_json(folder / name).get("eos_token_id")
        if isinstance(eos, int):
            return [eos]
        if isinstance(eos, list) and eos and all(isinstance(e, int) for e in eos):
            return eos
    return []


def _text_and_size(info: RequestInfo, chat: bool) -> tuple[str | None, Any, int]:
    """(completions text, or None for chat; chat messages; size in characters), or a size of
    -1 when the request is not one the router can tokenize as the engine would."""
    body = info.body
    if info.is_chat:
        if not chat or any(k in body for k in _CHAT_UNFOLLOWED) \
                or body.get("continue_final_message") is True:  # fmt: skip
            return None, None, -1
        return None, body["messages"], len(info.prompt_text)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]  # the engine takes a list of one prompt as that prompt
    if isinstance(prompt, str) and prompt:
        return prompt, None, len(prompt)
    return None, None, -1


class TextTokens:
    """The configured tokenizer (or none) and the rules for when to use it."""

    def __init__(self) -> None:
        self.cfg = TokenizerConfig()
        self.tokenizer: ModelTokenizer | None = None
        self.error = ""  # why the configured tokenizer is not in use ("" when it is or none)
        self._executor: ThreadPoolExecutor | None = None

    def configure(self, cfg: TokenizerConfig) -> None:
        """Follow a config: load when the path changes (a push keeps a loaded tokenizer)."""
        path_changed = cfg.path != self.cfg.path
        self.cfg = cfg
        if not path_changed:
            return
        self.tokenizer, self.error = None, ""
        if not cfg.path:
            return
        try:
            self.tokenizer = ModelTokenizer(cfg.path)
        except TokenizerLoadError as exc:
            self.error = str(exc)
            log.error("prefix.tokenizer: %s; text prompts use the approximate index only",
                      exc)
            return
        log.info("prefix.tokenizer: %s loaded; text prompts can use the precise index",
                 cfg.path)

    @staticmethod
    def wanted(endpoints: list[EndpointState], block_sizes: dict[str, int]) -> bool:
        """Some candidate keeps a precise index with a known block size."""
        return any(e.prefix_mode == "precise" and block_sizes.get(e.name)
                   for e in endpoints)

    def ids(self, info: RequestInfo, endpoints: list[EndpointState],
            block_sizes: dict[str, int]) -> list[int] | None:
        """The prompt's token ids: the client's own, else the text's (tokenized inline the
        first time, then cached on `info`), else None."""
        if info.prompt_token_ids is not None:
            return info.prompt_token_ids
        if not info.is_text_tokenized and self.tokenizer is not None \
                and self.wanted(endpoints, block_sizes):  # fmt: skip
            self._tokenize(info, endpoints, batch=False)
        return info.text_token_ids

    def offload(self, info: RequestInfo, endpoints: list[EndpointState],
                block_sizes: dict[str, int]) -> Future[None] | None:
        """Start tokenizing a large text prompt on a thread, so that `ids` finds it cached
        (the HTTP front awaits it with asyncio.wrap_future; the routing core imports no
        asyncio); None for a small one, which `ids` tokenizes inline (a thread hop costs
        more than it saves there) or one that needs no tokens."""
        if info.prompt_token_ids is not None or info.is_text_tokenized \
                or self.tokenizer is None \
                or len(info.prompt_text) <= self.cfg.offload_chars \
                or not self.wanted(endpoints, block_sizes):  # fmt: skip
            return None
        if self._executor is None:
            self._executor = ThreadPoolExecutor(2, thread_name_prefix="kvfleet-tokenize")
        info.is_text_tokenized = True  # a second route() must not tokenize it again inline
        return self._executor.submit(self._tokenize, info, endpoints, True)

    def _tokenize(self, info: RequestInfo, endpoints: list[EndpointState], batch: bool) -> None:
        tok = self.tokenizer
        info.is_text_tokenized = True
        text, messages, size = _text_and_size(info, self.cfg.chat)
        if tok is None or size < 0:
            return
        # kvfleet's engine and vLLM add special tokens differently; one rule per pool, taken
        # from its precise endpoints (a pool runs one engine kind).
        hf_special = any(e.engine == "vllm" for e in endpoints if e.prefix_mode == "precise")
        try:
            if messages is not None:
                add_generation_prompt = info.body.get("add_generation_prompt", True)
                text = tok.render(messages, add_generation_prompt is not False)
                hf_special = False  # the template writes the special tokens itself
            assert text is not None
            info.text_token_ids = tok.encode(text, hf_special, batch)
        except ChatTemplateError as exc:  # the engine will refuse it too, with a 400
            log.debug("chat template refused a request: %s", exc)
        except (UnicodeEncodeError, TypeError):  # lone surrogates (`tokenizers` raises a
            pass  # TypeError for them), which the engine refuses as well

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
