"""What a routing decision looks at besides the endpoints: the request and its prefix view."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from kvfleet_router.endpoint import EndpointState
from kvfleet_router.prefix_index import ChainIndex
from kvfleet_router.request_info import RequestInfo


@dataclass(slots=True, frozen=True)
class LoadSnapshot:
    """An endpoint's load as a decision saw it: the perf model's inputs."""

    uncached_tokens: float
    num_waiting: float  # queued ahead, not yet running
    num_running: float
    num_in_flight: float  # waiting + running (the queue scorer's depth)
    kv_usage: float


def load_snapshot(e: EndpointState, uncached_tokens: float) -> LoadSnapshot:
    """Running = the last fresh scrape's running count (at most the depth), waiting = the
    rest of the live depth (the router's own in-flight plus foreign load)."""
    depth = e.queue_depth()
    if e.is_signals_fresh:
        running = min(depth, e.signals.num_running)
        kv = e.signals.kv_usage
    else:
        running, kv = 0.0, 0.0
    return LoadSnapshot(uncached_tokens, depth - running, running, depth, kv)


@dataclass(slots=True)
class RouteContext:
    request: RequestInfo = field(default_factory=RequestInfo)
    role: str = "unified"  # the role wanted for this leg
    num_prompt_tokens: int = 0  # estimated without a tokenizer when only text is known
    prefix_fraction: dict[str, float] = field(default_factory=dict)  # endpoint -> matched/total
    # endpoint -> extra fraction a peer fetch is worth (kv_sharing; peer_hint.fetch_credit)
    peer_credit: dict[str, float] = field(default_factory=dict)
    # the router's approximate prefix index, read-only (the space scorer counts its blocks)
    prefix_index: ChainIndex = field(default_factory=lambda: ChainIndex(1))
    # SLO targets the request carries (x-kvfleet-slo-ttft-ms / -tpot-ms); None: config's
    slo_ttft_s: float | None = None
    slo_tpot_s: float | None = None
    # endpoint -> seats there the request outranks (flow/seats.py: the engine preempts one
    # of them for it), which the saturation filter does not count; empty outside flow control
    outranked: dict[str, int] = field(default_factory=dict)
    now: float = 0.0
    rng: random.Random = field(default_factory=random.Random)
    # Filled in by Policy.choose for the chosen endpoint, read back by the learning hook
    # (scorers_feedback.learn): its load when the decision was made, and what the SLO
    # scorer predicted there (None when no prediction was made).
    chosen_load: LoadSnapshot | None = None
    predicted_ttft_s: float | None = None
    predicted_tpot_s: float | None = None
    predictions: dict[str, tuple[float, float]] = field(default_factory=dict)  # slo scorer

    def uncached_tokens(self, endpoint: str) -> float:
        return self.num_prompt_tokens * (1.0 - self.prefix_fraction.get(endpoint, 0.0))
