"""Render chat messages into a prompt with the model's Jinja template, or ChatML without one.

In the contract because engine and router must render identically: the router tokenizes text
prompts for its precise prefix index (kvfleet_router.text_tokens). Pure: jinja2 only."""

from __future__ import annotations

from functools import lru_cache
from typing import Any

# Used when the model ships no template (tiny test models, bare checkpoints).
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


class ChatTemplateError(ValueError):
    """Messages that cannot be rendered, or a template that fails."""


def normalize_messages(messages: Any) -> list[dict[str, str]]:
    """Check OpenAI-style messages; flatten list-of-parts content into text."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ChatTemplateError(f"messages[{i}] must be an object with a string 'role'")
        content = m.get("content", "")
        if isinstance(content, list):
            parts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise ChatTemplateError(f"messages[{i}].content supports only text parts")
                parts.append(str(part.get("text", "")))
            content = "".join(parts)
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise ChatTemplateError(f"messages[{i}].content must be a string or text parts")
        out.append({"role": m["role"], "content": content})
    return out


def _chatml(messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ChatTemplateError(message)

    # Same whitespace options as HF transformers, so templates render as their authors meant.
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def compile_template(template: str) -> None:
    """Check that a template compiles (a config-time check); raises ChatTemplateError."""
    import jinja2

    try:
        _compile(template)
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc


def render_chat(template: str | None, messages: Any, add_generation_prompt: bool = True,
                bos_token: str = "", eos_token: str = "") -> str:
    msgs = normalize_messages(messages)
    try:
        import jinja2
    except ImportError:  # jinja2 is a dependency, but a bare install still gets ChatML
        return _chatml(msgs, add_generation_prompt)
    try:
        return str(_compile(template or CHATML_TEMPLATE).render(
            messages=msgs, add_generation_prompt=add_generation_prompt,
            bos_token=bos_token, eos_token=eos_token))
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(f"chat template failed: {exc}") from exc
