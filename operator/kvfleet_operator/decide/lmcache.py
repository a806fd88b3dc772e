"""LMCache-based KV sharing for vLLM pools (`routing.kvSharing` with `engine.kind: vllm`),
pure.

Every engine runs vLLM's LMCache connector (`--kv-transfer-config` with
`LMCacheConnectorV1`, role `kv_both`: it stores the KV it computes and loads what another
replica stored) against one LMCache server per pool, `lmcache_server <host> <port> cpu`
(LMCache's standalone KV store, `lm://` protocol, in CPU memory), which the Kubernetes
runtime runs as a child of the pool (runtimes/kubernetes/build/lmcache_server.py). LMCache is
configured through its `LMCACHE_*` environment variables:

- `LMCACHE_REMOTE_URL`: `lm://<server Service>:65432`;
- `LMCACHE_REMOTE_SERDE`: `naive` (raw tensors, no compression);
- `LMCACHE_CHUNK_SIZE`: 256 tokens per stored chunk (LMCache's default);
- `LMCACHE_USE_EXPERIMENTAL`: `True` (LMCache's v1 engine, which the V1 connector uses);
- `PYTHONHASHSEED=0`: chunk keys hash token ids, so every replica must hash alike.

The engine image must carry LMCache (e.g. `lmcache/vllm-openai`); the server runs the same
image. The local runtime (`kvfleet up`) runs no LMCache server, so it renders none of this
and warns (runtimes/local/spec_support.py).
"""

from __future__ import annotations

from kvfleet_operator.api.spec import PoolSpec

LMCACHE_KV_TRANSFER_CONFIG = {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
LMCACHE_PORT = 65432  # the conventional lm:// port
LMCACHE_CHUNK_SIZE = 256
LMCACHE_SERDE = "naive"


def is_lmcache(spec: PoolSpec) -> bool:
    """The pool shares KV through LMCache: kvSharing on vLLM engines."""
    return spec.routing.kv_sharing.enabled and spec.engine.kind == "vllm"


def lmcache_url(host: str, port: int = LMCACHE_PORT) -> str:
    return f"lm://{host}:{port}"


def lmcache_env(url: str) -> dict[str, str]:
    """The engines' LMCache settings, pointing at the server at `url`."""
    return {
        "LMCACHE_REMOTE_URL": url,
        "LMCACHE_REMOTE_SERDE": LMCACHE_SERDE,
        "LMCACHE_CHUNK_SIZE": str(LMCACHE_CHUNK_SIZE),
        "LMCACHE_USE_EXPERIMENTAL": "True",
        "PYTHONHASHSEED": "0",
    }


def lmcache_server_args(port: int = LMCACHE_PORT) -> list[str]:
    """`lmcache_server`'s positional arguments: listen address, port, storage device."""
    return ["0.0.0.0", str(port), "cpu"]
