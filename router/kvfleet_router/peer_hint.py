"""Move KV instead of a request: when to attach a peer-prefix hint, pure.

After the policy picked an endpoint, the router compares how many leading blocks of the
prompt that endpoint caches with what its peers cache (the precise index, fed by KV
events). With `kv_sharing.enabled`, the best peer holding at least `min_gain_blocks`
more blocks than the chosen endpoint is named in a `kv_transfer_params.peer_prefix` hint
(`contract.peer_prefix_hint`) when fetching beats recomputing by the margin:

    n         = min(peer's leading blocks, full prompt blocks a hit may use)
    gain      = n - chosen endpoint's leading blocks          (>= min_gain_blocks)
    fetch_s   = latency_s + n * bytes_per_block / bandwidth   (the fetch starts at the root)
    recompute = gain * block_size / prefill_tokens_per_s
    attach when fetch_s * margin < recompute                  (contract.estimate_fetch)

The engine asks the peer for all n blocks (those it caches already travel again), so the
bytes of the n blocks are charged to the `gain` blocks saved. Inputs, each measured where
it can be and a configured prior otherwise (`decision_inputs`):

- bandwidth: the chosen endpoint's past peer fetches (peer_measure.py), else
  `kv_sharing.bandwidth_bytes_per_s`;
- bytes per block: the peer's exports, else the chosen endpoint's, else
  `kv_sharing.kv_bytes_per_token * block_size`;
- prefill rate: 1 / the chosen endpoint's SLO EWMA `prefill_s_per_token` (TTFT per
  uncached prompt token of its streamed answers), else 1 / `policy.slo.prefill_s_per_token`.

The same rule credits the policy's prefix scorer (`peer_credits`, `RouteContext.peer_credit`):
an endpoint that would be told to fetch `gain` blocks is scored as if it cached
`gain * (1 - fetch_s / recompute_s)` of them, the share of their prefill the fetch saves.
So with sharing on, a cold endpoint with a short queue can outscore the warm, busy one,
and the imbalance guard's or the queue scorer's choice keeps the warm cache's value.

The hint carries `timeout_s` = the estimate's recompute time (at least
`MIN_FETCH_TIMEOUT_S`): a fetch still waiting then is given up, so a slow link or a
busy peer costs the request about what recomputing would have (`fetch_timeout_s`).

Reasons (`kvfleet_router_peer_hints_total{reason}`): `attached`; `no-peer` (no eligible
peer holds enough more); `recompute-cheaper` (the estimate says recompute);
`not-eligible` (a text prompt, an endpoint that is not a builtin engine in precise mode,
or a block size not yet known).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kvfleet_engine.contract.kv_fetch_decision import FetchEstimate, estimate_fetch

from kvfleet_router.config import KVSharingConfig, RouterConfig
from kvfleet_router.endpoint import EndpointState

ATTACHED = "attached"
NO_PEER = "no-peer"
RECOMPUTE_CHEAPER = "recompute-cheaper"
NOT_ELIGIBLE = "not-eligible"
REASONS = (ATTACHED, NO_PEER, RECOMPUTE_CHEAPER, NOT_ELIGIBLE)
MIN_FETCH_TIMEOUT_S = 0.1  # a hint's fetch limit is never shorter


@dataclass(frozen=True, slots=True)
class PeerCandidate:
    name: str
    url: str
    num_blocks: int  # leading prompt blocks it caches
    bytes_per_block: float | None = None  # measured from its exports


@dataclass(frozen=True, slots=True)
class HintInputs:
    num_local_blocks: int  # leading prompt blocks the chosen endpoint caches
    num_usable_blocks: int  # full prompt blocks a prefix hit may cover
    block_size: int
    peers: Sequence[PeerCandidate]
    bandwidth_bytes_per_s: float
    bytes_per_block: float  # when the peer's own figure is unknown
    latency_s: float
    prefill_tokens_per_s: float
    margin: float
    min_gain_blocks: int


@dataclass(frozen=True, slots=True)
class HintDecision:
    reason: str
    peer: PeerCandidate | None = None
    num_blocks: int = 0  # blocks, from the root, the hint names
    estimate: FetchEstimate | None = None

    @property
    def is_attached(self) -> bool:
        return self.reason == ATTACHED


def num_usable_blocks(num_prompt_tokens: int, block_size: int) -> int:
    """Full prompt blocks a prefix hit may cover: the last prompt token is always computed
    (the engine's `core.prefix_share.num_usable_blocks`)."""
    return max(0, (num_prompt_tokens - 1) // block_size)


def decide_peer_hint(inp: HintInputs) -> HintDecision:
    """The hint to attach, if any (module docstring)."""
    if not inp.peers:
        return HintDecision(NO_PEER)
    best = max(inp.peers, key=lambda p: p.num_blocks)  # first of the longest on ties
    n = min(best.num_blocks, inp.num_usable_blocks)
    gain = n - inp.num_local_blocks
    if gain < max(1, inp.min_gain_blocks):
        return HintDecision(NO_PEER)
    per_block = best.bytes_per_block or inp.bytes_per_block
    estimate = estimate_fetch(
        num_blocks=gain, block_size=inp.block_size,
        bytes_per_block=math.ceil(per_block * n / gain),
        bandwidth_bytes_per_s=inp.bandwidth_bytes_per_s, latency_s=inp.latency_s,
        prefill_tokens_per_s=inp.prefill_tokens_per_s, margin=inp.margin)
    reason = ATTACHED if estimate.is_fetch_better else RECOMPUTE_CHEAPER
    return HintDecision(reason, best, n, estimate)


def fetch_credit(decision: HintDecision, num_local_blocks: int) -> float:
    """Blocks a fetch is worth to the policy: the gain, times the share of its recompute
    time the fetch saves; 0 unless the decision attaches a hint."""
    est = decision.estimate
    if not decision.is_attached or est is None or not est.recompute_s > 0:
        return 0.0
    gain = decision.num_blocks - num_local_blocks
    return gain * max(0.0, 1.0 - est.fetch_s / est.recompute_s)


def fetch_timeout_s(decision: HintDecision) -> float | None:
    """The hint's `timeout_s`: the recompute time the fetch is meant to beat."""
    if decision.estimate is None:
        return None
    return max(MIN_FETCH_TIMEOUT_S, decision.estimate.recompute_s)


def prefill_tokens_per_s(e: EndpointState, cfg: RouterConfig) -> float:
    s_per_token = e.prefill_s_per_token.value
    if s_per_token is None or not s_per_token > 0:
        s_per_token = cfg.policy.slo.prefill_s_per_token
    return 1.0 / s_per_token


def decision_inputs(chosen: EndpointState, num_local_blocks: int, num_prompt_tokens: int,
                    block_size: int, peers: Sequence[PeerCandidate],
                    cfg: RouterConfig) -> HintInputs:
    """The estimate's inputs: what `chosen` measured, else the priors of `cfg`."""
    ks: KVSharingConfig = cfg.kv_sharing
    measure = chosen.peer_measure
    bandwidth = measure.bandwidth.value or ks.bandwidth_bytes_per_s
    per_block = measure.bytes_per_block or ks.kv_bytes_per_token * block_size
    return HintInputs(
        num_local_blocks=num_local_blocks,
        num_usable_blocks=num_usable_blocks(num_prompt_tokens, block_size),
        block_size=block_size, peers=peers, bandwidth_bytes_per_s=bandwidth,
        bytes_per_block=per_block, latency_s=ks.latency_s,
        prefill_tokens_per_s=prefill_tokens_per_s(chosen, cfg), margin=ks.margin,
        min_gain_blocks=ks.min_gain_blocks)


def can_take_hint(e: EndpointState) -> bool:
    """A builtin engine indexed precisely: it understands the hint and its cache is known."""
    return e.engine == "builtin" and e.prefix_mode == "precise"


def can_serve_cache(e: EndpointState, model: str | None, now: float) -> bool:
    """A builtin engine that may serve its cache to another: precisely indexed, healthy,
    still configured (a draining one stays a peer until it is removed), serving the model."""
    return (can_take_hint(e) and not e.is_removed and e.is_healthy(now)
            and (not e.models or model is None or model in e.models))

