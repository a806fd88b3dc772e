"""The pool's two bearer tokens: read back from their Secrets, or generated once.

A Secret that exists keeps its token for the pool's lifetime (routers and engines hold it);
only a missing one (404) gets a new token. Any other API error is raised, never papered over
with a fresh token. Tokens are never logged, put in status, args or events.
"""

from __future__ import annotations

import base64
import binascii
import secrets

from kvfleet_operator.api.pool import InferencePool
from kvfleet_operator.runtimes.kubernetes.build import meta
from kvfleet_operator.runtimes.kubernetes.build.options import Tokens
from kvfleet_operator.runtimes.kubernetes.build.secret import TOKEN_KEY
from kvfleet_operator.runtimes.kubernetes.ports.kube_client import KubeClient, object_path

TOKEN_BYTES = 32


def new_token() -> str:
    return secrets.token_urlsafe(TOKEN_BYTES)


async def read_token(client: KubeClient, namespace: str, name: str) -> str | None:
    """The token in Secret `name`, or None when the Secret (or its key) is missing."""
    found = await client.get(object_path("v1", "Secret", namespace, name))
    encoded = ((found or {}).get("data") or {}).get(TOKEN_KEY)
    if not encoded:
        return None
    try:
        return base64.b64decode(encoded, validate=True).decode() or None
    except (binascii.Error, UnicodeDecodeError):
        return None


async def ensure_tokens(client: KubeClient, pool: InferencePool) -> Tokens:
    admin = await read_token(client, pool.namespace, meta.admin_secret_name(pool))
    engine = await read_token(client, pool.namespace, meta.engine_secret_name(pool))
    return Tokens(admin=admin or new_token(), engine=engine or new_token())
