"""The peer-prefix hint: "the peer at URL holds the first N blocks of this prompt".

A router that sends a request to a replica lacking its prefix, while a peer holds it,
attaches (inside the request body's `kv_transfer_params`, beside vLLM's P/D keys):

    "kv_transfer_params": {"peer_prefix": {"url": "http://10.0.0.7:8000",
                                           "block_hashes": [8841..., 1290..., ...]}}

- `url`: the peer engine's base URL, http or https, host and optional port, no path,
  query, fragment or credentials.
- `block_hashes`: the engine's chained block hashes (`core.block_pool.hash_block_tokens`,
  the values its KV events carry) of the prompt's first N full blocks, from the root,
  in order; at most `MAX_PEER_PREFIX_BLOCKS`, each an integer in [0, 2**63).
- `timeout_s` (optional): give up the fetch after this many seconds, when it is shorter
  than the engine's own `--peer-fetch-timeout`. A router sets it to its estimate of the
  recompute time, so a peer stuck in a long engine step costs the request about what
  recomputing would have, not the whole engine timeout. A number in (0, 3600].

The receiving engine asks the peer's `POST /v1/kv_cache/export` (behind the engine token)
for the blocks of the hashes that match the prompt's own hashes, verifies what comes back
against the prompt, installs it in its prefix cache and computes only the rest. Whatever
goes wrong then (peer unknown, down, slow, 401, evicted, wrong hashes) the request is
recomputed, never failed; only a hint that breaks the format above is a 400.

`peer_prefix_hint` builds the value; `parse_peer_prefix` is the engine's reader. Stdlib
only: the router imports this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

PEER_PREFIX = "peer_prefix"  # key inside kv_transfer_params
PEER_URL = "url"
PEER_BLOCK_HASHES = "block_hashes"
PEER_TIMEOUT = "timeout_s"
MAX_TIMEOUT_S = 3600.0
MAX_PEER_PREFIX_BLOCKS = 8192  # 131,072 tokens at block size 16
MAX_HASH = 2**63  # hashes are masked to 63 bits
MAX_URL_CHARS = 2048

# The peer's read-only export: JSON {"block_hashes": [...]} in, one KV frame out (KVT1).
EXPORT_PATH = "/v1/kv_cache/export"

# --- metrics (counters are exposed with a `_total` suffix) ---
PEER_FETCH = "kvfleet:peer_fetch"  # counter, label outcome: requests that carried a hint
PEER_FETCH_BLOCKS = "kvfleet:peer_fetch_blocks"  # counter: fetched blocks installed
PEER_FETCH_TOKENS = "kvfleet:peer_fetch_tokens"  # counter: prompt tokens those blocks hold
PEER_FETCH_BYTES = "kvfleet:peer_fetch_bytes"  # counter: KV payload bytes received
PEER_FETCH_SECONDS = "kvfleet:peer_fetch_seconds"  # histogram: hint read to blocks in hand
# A fetch that timed out: the KV bytes it asked for (blocks asked x bytes per block) and the
# seconds it waited. Their deltas' ratio bounds the link's bandwidth from above.
PEER_FETCH_TIMEOUT_BYTES = "kvfleet:peer_fetch_timeout_bytes_asked"  # counter
PEER_FETCH_TIMEOUT_SECONDS = "kvfleet:peer_fetch_timeout_seconds"  # counter
PEER_EXPORT_BLOCKS = "kvfleet:peer_export_blocks"  # counter: blocks served to peers
PEER_EXPORT_BYTES = "kvfleet:peer_export_bytes"  # counter: KV payload bytes served to peers
OUTCOME_LABEL = "outcome"

# Outcomes of one hint. Only "hit" and "partial" installed blocks; every other one means the
# request computed its whole prompt (except what the local prefix cache held anyway).
OUTCOME_HIT = "hit"  # every block asked for was installed
OUTCOME_PARTIAL = "partial"  # a leading part of them (the peer had evicted the rest)
OUTCOME_MISS = "miss"  # the peer held none of them any more
OUTCOME_MISMATCH = "mismatch"  # the hint's or the peer's blocks are not this prompt's
OUTCOME_UNAUTHORIZED = "unauthorized"  # the peer refused our engine token (401/403)
OUTCOME_UNREACHABLE = "unreachable"  # unknown host, refused, reset: the peer is not there
OUTCOME_TIMEOUT = "timeout"  # the peer did not answer within the fetch timeout
OUTCOME_ERROR = "error"  # any other answer: non-200, a damaged or incompatible frame
OUTCOME_NO_ROOM = "no_room"  # this replica had no free blocks to install them in
OUTCOME_SKIPPED = "skipped"  # nothing to fetch: prompt under two blocks, or no prefix cache
OUTCOME_INVALID = "invalid"  # the hint broke the format (the request got a 400)
OUTCOMES = (OUTCOME_HIT, OUTCOME_PARTIAL, OUTCOME_MISS, OUTCOME_MISMATCH, OUTCOME_UNAUTHORIZED,
            OUTCOME_UNREACHABLE, OUTCOME_TIMEOUT, OUTCOME_ERROR, OUTCOME_NO_ROOM, OUTCOME_SKIPPED,
            OUTCOME_INVALID)


class PeerPrefixError(ValueError):
    """The hint breaks the format; the message names the field."""


@dataclass(frozen=True, slots=True)
class PeerPrefix:
    url: str  # base URL, no trailing slash
    block_hashes: tuple[int, ...]
    timeout_s: float | None = None  # the sender's limit, if any

    @property
    def export_url(self) -> str:
        return self.url + EXPORT_PATH

    def fetch_timeout_s(self, engine_timeout_s: float) -> float:
        """The fetch's limit: the engine's, or the hint's when that is shorter."""
        if self.timeout_s is None:
            return engine_timeout_s
        return min(engine_timeout_s, self.timeout_s)


def peer_prefix_hint(url: str, block_hashes: Sequence[int],
                     timeout_s: float | None = None) -> dict[str, Any]:
    """The `kv_transfer_params` entry naming a peer and the prompt blocks it holds
    (merge it into the request's kv_transfer_params). Raises PeerPrefixError when the
    same value would be refused by the engine."""
    value: dict[str, Any] = {PEER_URL: url, PEER_BLOCK_HASHES: [int(h) for h in block_hashes]}
    if timeout_s is not None:
        value[PEER_TIMEOUT] = round(float(timeout_s), 6)
    parse_peer_prefix({PEER_PREFIX: value})
    return {PEER_PREFIX: value}


def parse_peer_prefix(kv_transfer_params: Mapping[str, Any] | None) -> PeerPrefix | None:
    """The hint in a request's kv_transfer_params, None when there is none (or it is null)."""
    if not kv_transfer_params:
        return None
    value = kv_transfer_params.get(PEER_PREFIX)
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise PeerPrefixError(f"`{PEER_PREFIX}` must be an object")
    url = _base_url(value.get(PEER_URL))
    hashes = value.get(PEER_BLOCK_HASHES)
    if not isinstance(hashes, list) or not hashes:
        raise PeerPrefixError(f"`{PEER_PREFIX}.{PEER_BLOCK_HASHES}` must be a non-empty list")
    if len(hashes) > MAX_PEER_PREFIX_BLOCKS:
        raise PeerPrefixError(f"`{PEER_PREFIX}.{PEER_BLOCK_HASHES}` has {len(hashes)} entries; "
                              f"at most {MAX_PEER_PREFIX_BLOCKS}")
    if not all(type(h) is int and 0 <= h < MAX_HASH for h in hashes):
        raise PeerPrefixError(f"`{PEER_PREFIX}.{PEER_BLOCK_HASHES}` must hold integers in "
                              "[0, 2**63)")
    return PeerPrefix(url, tuple(hashes), _timeout(value.get(PEER_TIMEOUT)))


def _timeout(value: Any) -> float | None:
    if value is None:
        return None
    if type(value) not in (int, float) or not 0 < value <= MAX_TIMEOUT_S:
        raise PeerPrefixError(f"`{PEER_PREFIX}.{PEER_TIMEOUT}` must be a number of seconds "
                              f"in (0, {MAX_TIMEOUT_S:g}]")
    return float(value)


def _base_url(url: Any) -> str:
    where = f"`{PEER_PREFIX}.{PEER_URL}`"
    if not isinstance(url, str) or not url or len(url) > MAX_URL_CHARS:
        raise PeerPrefixError(f"{where} must be a URL of at most {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        port = parts.port  # ValueError when out of range or not a number
    except ValueError:
        raise PeerPrefixError(f"{where} is not a valid URL") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PeerPrefixError(f"{where} must be an http(s) URL with a host")
    if parts.username is not None or parts.password is not None or parts.query \
            or parts.fragment or parts.path not in ("", "/") or port == 0:
        raise PeerPrefixError(f"{where} must be a base URL: scheme, host and port only")
    return url.rstrip("/")
