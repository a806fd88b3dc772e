"""Parse a client body once and keep only what routing needs.

The raw bytes are forwarded untouched; this object only informs the policy (and P/D,
which must add `kv_transfer_params`, so it keeps the parsed dict too).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from kvfleet_engine.contract import KV_TRANSFER_PARAMS
from kvfleet_engine.contract.http_limits import JSONRejected, strict_loads

from kvfleet_router.request_error import RequestError

PRIORITY_HEADER = "x-kvfleet-priority"
# A request's own SLO targets, in milliseconds (the `slo` policy's; the config's otherwise).
SLO_TTFT_HEADER = "x-kvfleet-slo-ttft-ms"
SLO_TPOT_HEADER = "x-kvfleet-slo-tpot-ms"
MAX_SLO_MS = 3_600_000.0  # an hour: anything longer is not a latency target
TENANT_HEADER = "x-kvfleet-tenant"  # flow_control.tenant_header's default
DEFAULT_TENANT = "default"
MAX_TENANT_CHARS = 128


@dataclass(slots=True)
class RequestInfo:
    model: str | None = None
    prompt_text: str = ""  # prompt, or chat messages rendered "role: content\n"
    prompt_token_ids: list[int] | None = None  # only when the client sent token ids
    is_chat: bool = False  # /chat/completions: `body["messages"]`, else `body["prompt"]`
    # The text prompt's token ids, when the router tokenized it for the precise index
    # (text_tokens.py; is_text_tokenized: tried once, whatever came of it)
    text_token_ids: list[int] | None = None
    is_text_tokenized: bool = False
    session_key: str | None = None
    priority: int = 0  # lower runs first, as in vLLM
    is_stream: bool = False
    max_tokens: int = 16
    slo_ttft_s: float | None = None  # SLO_TTFT_HEADER, in seconds
    slo_tpot_s: float | None = None  # SLO_TPOT_HEADER, in seconds
    tenant: str = DEFAULT_TENANT  # flow_control.tenant_header, or the default tenant
    # The engine revision the split assigned (revisions.py), set at the first dispatch
    # (a P/D request's: its decode endpoint's, so a retry tries that revision first).
    revision: str | None = None
    # P/D: the revision of the prefill whose KV the decode body carries; an attempt on an
    # endpoint of another revision is sent the client's own body (no pairing across).
    kv_revision: str | None = None
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def token_ids(self) -> list[int] | None:
        """The client's token ids, else the router's tokenization of the text, else None."""
        ids = self.prompt_token_ids
        return ids if ids is not None else self.text_token_ids

    def estimated_prompt_tokens(self, chars_per_token: float) -> int:
        ids = self.token_ids
        if ids is not None:
            return len(ids)
        return int(len(self.prompt_text) / chars_per_token)


def _render_messages(messages: Any) -> str:
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list", param="messages")
    parts: list[str] = []
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict):
            raise RequestError(f"messages[{i}] must be an object", param="messages")
        content = msg.get("content")
        if isinstance(content, list):  # OpenAI content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        parts.append(f"{msg.get('role', '')}: {content if content is not None else ''}\n")
    return "".join(parts)


MAX_TOKEN_ID = 2**31 - 1  # no vocabulary is larger; the prefix index packs ids as int64


def _is_token_ids(ids: list[Any]) -> bool:
    return all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= MAX_TOKEN_ID
               for t in ids)


def _prompt(prompt: Any) -> tuple[str, list[int] | None]:
    if isinstance(prompt, str):
        return prompt, None
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, str) for p in prompt):
            return "".join(prompt), None
        if _is_token_ids(prompt):
            return "", list(prompt)
        if isinstance(prompt[0], list) and prompt[0] and _is_token_ids(prompt[0]):
            return "", list(prompt[0])  # batched token prompts: route by the first
    raise RequestError("'prompt' must be a string, a list of strings or token ids "
                       f"(integers in [0, {MAX_TOKEN_ID}])", param="prompt")


def parse_request(raw: bytes, path: str, headers: Any, session_header: str,
                  use_user_field: bool, tenant_header: str = TENANT_HEADER,
                  default_tenant: str = DEFAULT_TENANT) -> RequestInfo:
    try:
        body = strict_loads(raw)  # depth, digits and NaN refused before parsing
    except JSONRejected as exc:
        what = "is not valid JSON" if exc.code == "invalid_json" else "refused"
        raise RequestError(f"request body {what}: {exc}", code=exc.code) from None
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    if KV_TRANSFER_PARAMS in body:
        # The router alone sets it (P/D legs). From a client it would make an engine pull
        # "KV" from any host, sending that host the fleet's engine token.
        raise RequestError(f"'{KV_TRANSFER_PARAMS}' is set by the router, not by clients",
                           param=KV_TRANSFER_PARAMS, code="router_owned_field")
    info = RequestInfo(body=body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise RequestError("'model' must be a string", param="model")
    info.model = model
    info.is_chat = path.endswith("/chat/completions")
    if info.is_chat:
        info.prompt_text = _render_messages(body.get("messages"))
    else:
        if "prompt" not in body:
            raise RequestError("'prompt' is required", param="prompt")
        info.prompt_text, info.prompt_token_ids = _prompt(body["prompt"])
    info.is_stream = body.get("stream") is True
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", 16))
    info.max_tokens = max_tokens if isinstance(max_tokens, int) and max_tokens > 0 else 16
    session = headers.get(session_header)
    if not session and use_user_field and isinstance(body.get("user"), str):
        session = body["user"]
    info.session_key = session or None
    priority = headers.get(PRIORITY_HEADER, body.get("priority", 0))
    try:
        info.priority = int(priority)
    except (TypeError, ValueError):
        raise RequestError("priority must be an integer", param="priority") from None
    info.slo_ttft_s = _slo_target(headers, SLO_TTFT_HEADER)
    info.slo_tpot_s = _slo_target(headers, SLO_TPOT_HEADER)
    info.tenant = _tenant(headers.get(tenant_header), tenant_header) or default_tenant
    return info


def _tenant(raw: Any, name: str) -> str | None:
    """The tenant id a header names; None when absent or empty. Printable, at most
    MAX_TENANT_CHARS characters."""
    if not raw:
        return None
    tenant = str(raw).strip()
    if len(tenant) > MAX_TENANT_CHARS or not tenant.isprintable():
        raise RequestError(f"header {name} must be a printable tenant id of at most "
                           f"{MAX_TENANT_CHARS} characters", param=name)
    return tenant or None


def _slo_target(headers: Any, name: str) -> float | None:
    """A header's milliseconds as seconds; None when absent. In (0, MAX_SLO_MS]."""
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        ms = float(raw)
    except (TypeError, ValueError):
        ms = math.nan
    if not 0 < ms <= MAX_SLO_MS:  # also refuses NaN
        raise RequestError(f"header {name} must be a number of milliseconds in "
                           f"(0, {MAX_SLO_MS:.0f}], got {str(raw)[:40]!r}", param=name)
    return ms / 1000.0
