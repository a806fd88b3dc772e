"""The pool's two token Secrets: the router admin token (the operator's bearer token for
`/admin/config`) and the engine token (guards engines' KV events and KV transfer)."""

from __future__ import annotations

import base64
from typing import Any

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.runtimes.kubernetes.build import meta

TOKEN_KEY = "token"


def _secret(metadata: dict[str, Any], token: str) -> dict[str, Any]:
    data = base64.b64encode(token.encode()).decode()
    return {"apiVersion": "v1", "kind": "Secret", "metadata": metadata, "type": "Opaque",
            "data": {TOKEN_KEY: data}}


def build_admin_token_secret(pool: InferencePool, token: str) -> dict[str, Any]:
    metadata = meta.object_meta(pool, meta.admin_secret_name(pool), meta.ROUTER_APP,
                                meta.ROUTER, meta.ROUTER)
    return _secret(metadata, token)


def build_engine_token_secret(pool: InferencePool, token: str) -> dict[str, Any]:
    metadata = meta.object_meta(pool, meta.engine_secret_name(pool), meta.engine_app(pool),
                                meta.ENGINE, None)
    return _secret(metadata, token)
