"""The OpenAI surface kvfleet claims, checked with the real `openai` client against one base URL.

Used by bench/router_vllm_overhead.py against four bases (vLLM direct, kvfleet's router in front
of it, a kvfleet engine direct, the router in front of that). Each case returns pass/fail and
what it observed, so differences between backends are shown, not hidden.

Cases: /v1/models; completion (whole and streamed, the same greedy text); chat (whole and
streamed, with `stream_options.include_usage`); usage fields; `max_tokens`; `stop`; and the
error body (OpenAI-style JSON, status, type) of a bad request and of an unknown model.

The command line is bench/openai_conformance.py.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

import openai

PROMPT = "The three primary colours are"
CHAT = [{"role": "user", "content": "Name three primary colours."}]
GREEDY = {"temperature": 0.0}
NO_EOS = {"ignore_eos": True}  # vLLM's and kvfleet's extra sampling field


@dataclass(slots=True)
class Case:
    name: str
    is_ok: bool
    observed: str


def _usage_ok(usage, completion_tokens: int) -> tuple[bool, str]:
    if usage is None:
        return False, "no usage"
    ok = (usage.completion_tokens == completion_tokens and usage.prompt_tokens > 0
          and usage.total_tokens == usage.prompt_tokens + usage.completion_tokens)
    return ok, (f"prompt {usage.prompt_tokens}, completion {usage.completion_tokens}, "
                f"total {usage.total_tokens}")


def _raw_error(base_url: str, path: str, body: dict) -> tuple[int, str, dict]:
    """Status, content type and JSON body of a request expected to fail (no client library)."""
    req = urllib.request.Request(base_url.rstrip("/") + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            parsed = json.loads(raw)
        except ValueError:
            parsed = {"_raw": raw[:200].decode(errors="replace")}
        return exc.code, exc.headers.get("Content-Type", ""), parsed


def _error_case(base_url: str, client: openai.OpenAI, body: dict,
                statuses: tuple[int, ...]) -> tuple[bool, str]:
    status, ctype, parsed = _raw_error(base_url, "/chat/completions", body)
    err = parsed.get("error") if isinstance(parsed, dict) else None
    shape_ok = (isinstance(err, dict) and isinstance(err.get("message"), str)
                and bool(err.get("message")) and "type" in err and "code" in err)
    try:
        client.chat.completions.create(**body)
        sdk = "no exception"
    except openai.APIStatusError as exc:
        sdk = type(exc).__name__
    ok = status in statuses and ctype.startswith("application/json") and shape_ok
    etype = err.get("type") if isinstance(err, dict) else None
    code = err.get("code") if isinstance(err, dict) else None
    return ok, f"{status} {sdk}; type={etype!r} code={code!r}"


def check(base_url: str, model: str, max_tokens: int = 16) -> list[Case]:
    """Run every case against `base_url` (ending in /v1); never raises for a failed case."""
    client = openai.OpenAI(base_url=base_url, api_key="unused", max_retries=0, timeout=120)
    cases: list[Case] = []
    state: dict = {}

    def case(name: str, fn: Callable[[], tuple[bool, str]]) -> None:
        try:
            ok, observed = fn()
        except Exception as exc:  # noqa: BLE001 - a failed case is a result, not a crash
            ok, observed = False, f"{type(exc).__name__}: {str(exc)[:160]}"
        cases.append(Case(name, ok, observed))

    def models() -> tuple[bool, str]:
        ids = [m.id for m in client.models.list().data]
        return model in ids, f"ids {ids}"

    def completion() -> tuple[bool, str]:
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens,
                                      extra_body=NO_EOS, **GREEDY)
        state["text"] = r.choices[0].text
        u_ok, u = _usage_ok(r.usage, max_tokens)
        ok = (r.object == "text_completion" and bool(r.id) and r.model == model
              and bool(r.choices[0].text) and r.choices[0].finish_reason == "length" and u_ok)
        return ok, f"finish {r.choices[0].finish_reason}; usage {u}"

    def completion_stream() -> tuple[bool, str]:
        chunks = list(client.completions.create(
            model=model, prompt=PROMPT, max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body=NO_EOS, **GREEDY))
        text = "".join(c.choices[0].text for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices
                  and c.choices[0].finish_reason]
        usage = next((c.usage for c in chunks if c.usage), None)
        u_ok, u = _usage_ok(usage, max_tokens)
        same = text == state.get("text")
        return (same and finish == ["length"] and u_ok,
                f"{len(chunks)} chunks; text {'==' if same else '!='} whole; usage {u}")

    def chat() -> tuple[bool, str]:
        r = client.chat.completions.create(model=model, messages=CHAT, max_tokens=max_tokens,
                                           extra_body=NO_EOS, **GREEDY)
        msg = r.choices[0].message
        state["chat"] = msg.content
        u_ok, u = _usage_ok(r.usage, max_tokens)
        ok = (r.object == "chat.completion" and msg.role == "assistant" and bool(msg.content)
              and r.choices[0].finish_reason == "length" and u_ok)
        return ok, f"finish {r.choices[0].finish_reason}; usage {u}"

    def chat_stream() -> tuple[bool, str]:
        chunks = list(client.chat.completions.create(
            model=model, messages=CHAT, max_tokens=max_tokens, stream=True,
            stream_options={"include_usage": True}, extra_body=NO_EOS, **GREEDY))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        text = "".join(d.content or "" for d in deltas)
        roles = {d.role for d in deltas if d.role}
        usage = next((c.usage for c in chunks if c.usage), None)
        u_ok, u = _usage_ok(usage, max_tokens)
        same = text == state.get("chat")
        objs = {c.object for c in chunks}
        return (same and roles == {"assistant"} and objs == {"chat.completion.chunk"} and u_ok,
                f"{len(chunks)} chunks; text {'==' if same else '!='} whole; usage {u}")

    def max_tokens_case() -> tuple[bool, str]:
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=3,
                                      extra_body=NO_EOS, **GREEDY)
        ok = r.usage.completion_tokens == 3 and r.choices[0].finish_reason == "length"
        return ok, f"completion_tokens {r.usage.completion_tokens}, finish " \
                   f"{r.choices[0].finish_reason}"

    def stop() -> tuple[bool, str]:
        full = state.get("text") or ""
        words = [w for w in full.split() if w.isalpha() and full.find(w) > 0]
        if not words:
            return False, f"no word to stop on in {full!r}"
        word = words[len(words) // 2]
        r = client.completions.create(model=model, prompt=PROMPT, max_tokens=max_tokens,
                                      stop=[word], extra_body=NO_EOS, **GREEDY)
        text = r.choices[0].text
        expected = full[:full.find(word)]
        ok = r.choices[0].finish_reason == "stop" and text == expected
        return ok, f"stop {word!r}: finish {r.choices[0].finish_reason}, " \
                   f"text {'==' if text == expected else '!='} prefix before it"

    def bad_request() -> tuple[bool, str]:
        body = {"model": model, "messages": CHAT, "max_tokens": -1}
        return _error_case(base_url, client, body, (400, 422))

    def unknown_model() -> tuple[bool, str]:
        body = {"model": "no-such-model", "messages": CHAT, "max_tokens": 2}
        return _error_case(base_url, client, body, (400, 404))

    for name, fn in (("GET /v1/models lists the model", models),
                     ("completion (whole): fields, finish, usage", completion),
                     ("completion (streamed): same text, usage chunk", completion_stream),
                     ("chat (whole): assistant message, usage", chat),
                     ("chat (streamed): same text, role, usage chunk", chat_stream),
                     ("max_tokens 3 honoured", max_tokens_case),
                     ("stop string ends the text before it", stop),
                     ("bad request (max_tokens -1): JSON error body", bad_request),
                     ("unknown model: JSON error body", unknown_model)):
        case(name, fn)
    return cases
