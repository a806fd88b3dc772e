"""Pure estimate: is fetching a prefix from a peer faster than recomputing it here?

    fetch_s     = latency_s + num_blocks * bytes_per_block / bandwidth_bytes_per_s
    recompute_s = num_blocks * block_size / prefill_tokens_per_s
    fetch when  fetch_s * margin < recompute_s

`margin` >= 1 asks the fetch to win by that factor (the estimate ignores the install
time and the peer's read). Inputs come from what a caller measured: peer bandwidth from
`kvfleet:peer_fetch_bytes_total` over `kvfleet:peer_fetch_seconds` (capped by timed-out
fetches' `kvfleet:peer_fetch_timeout_bytes_asked_total` over
`kvfleet:peer_fetch_timeout_seconds_total`), the prefill rate from
uncached prompt tokens per busy second. Stdlib only: the router and the simulator use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class FetchEstimate:
    fetch_s: float
    recompute_s: float
    is_fetch_better: bool


def estimate_fetch(*, num_blocks: int, block_size: int, bytes_per_block: int,
                   bandwidth_bytes_per_s: float, latency_s: float,
                   prefill_tokens_per_s: float, margin: float = 1.0) -> FetchEstimate:
    """Both times and the decision; no fetch is ever better for zero blocks, a zero or
    unknown (non-finite) bandwidth, or a margin below 1."""
    if num_blocks < 0 or block_size < 1 or bytes_per_block < 0 or latency_s < 0:
        raise ValueError("num_blocks, bytes_per_block and latency_s must be >= 0, "
                         "block_size >= 1")
    if not prefill_tokens_per_s > 0:
        raise ValueError("prefill_tokens_per_s must be positive")
    recompute_s = num_blocks * block_size / prefill_tokens_per_s
    if not (bandwidth_bytes_per_s > 0 and math.isfinite(bandwidth_bytes_per_s)):
        return FetchEstimate(math.inf, recompute_s, False)
    fetch_s = latency_s + num_blocks * bytes_per_block / bandwidth_bytes_per_s
    is_better = num_blocks > 0 and margin >= 1.0 and fetch_s * margin < recompute_s
    return FetchEstimate(fetch_s, recompute_s, is_better)
