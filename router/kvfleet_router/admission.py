"""Admit one inference request: the checks every front applies before routing.

    info, policy = admit(core, raw, path, headers)   # raises RequestError (OpenAI shape)

Shared by the HTTP front (front.py) and the ext_proc Endpoint Picker front (epp/), so a
request is parsed, checked and refused the same way whichever front received it: the
body parsed once (no tokenizer), the per-request policy override (when allowed), and a
model no endpoint serves (404, OpenAI's `model_not_found`). Body-size limits are the
fronts' own, since each reads its body its own way.
"""

from __future__ import annotations

from collections.abc import Mapping

from kvfleet_router.errors import RequestError
from kvfleet_router.request_info import RequestInfo, parse_request
from kvfleet_router.router_core import RouterCore


def is_unknown_model(core: RouterCore, model: str) -> bool:
    """No configured endpoint serves `model` (endpoints without a model list serve any)."""
    eps = core.registry.endpoints
    return bool(eps) and all(e.models and model not in e.models for e in eps)


def admit(core: RouterCore, raw: bytes, path: str,
          headers: Mapping[str, str]) -> tuple[RequestInfo, str | None]:
    """(what routing needs, the policy override or None); raises RequestError."""
    cfg = core.cfg
    info = parse_request(raw, path, headers, cfg.session.header, cfg.session.use_user_field,
                         cfg.flow_control.tenant_header, cfg.flow_control.default_tenant)
    policy = None
    if cfg.policy.allow_override:
        policy = headers.get(cfg.policy.override_header) or None
        if policy is not None and policy not in core.policies:
            raise RequestError(f"unknown policy {policy!r}; known: {', '.join(core.policies)}",
                               param=cfg.policy.override_header)
    if info.model and is_unknown_model(core, info.model):
        raise RequestError(f"The model `{info.model}` does not exist.", param="model",
                           status=404, code="model_not_found")
    return info, policy
