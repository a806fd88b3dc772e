"""Whether a disaggregated request gets a separate prefill leg: pluggable deciders.

The P/D plan (pd_plan.py, which the router's pd.py and the simulator both run) picks the
decode endpoint first, since its prefix cache decides how much of the prompt is still to
compute; a decider then looks at that decision and says whether a prefill endpoint
should compute the prompt before decode starts.
Registered by type name in DECIDERS (config `pd.decider`); each factory takes the
RouterConfig and the decider is pure (no I/O, no clocks).

* uncached-tokens (default): prefill when the prompt tokens the chosen decode endpoint
  has not cached, num_prompt_tokens * (1 - prefix fraction there), exceed
  pd.prefill_threshold_tokens (tokens estimated at prefix.chars_per_token without a
  tokenizer). Short or mostly cached prompts run on the decode endpoint alone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from kvfleet_router.config import RouterConfig
from kvfleet_router.router_core import Routed


class PDDecider(Protocol):
    def wants_prefill(self, decode: Routed) -> bool:
        """`decode` holds the chosen decode endpoint and the request's prefix view."""
        ...


class UncachedTokens:
    def __init__(self, threshold_tokens: int) -> None:
        self.threshold_tokens = threshold_tokens

    def wants_prefill(self, decode: Routed) -> bool:
        e = decode.decision.endpoint
        return e is not None and decode.ctx.uncached_tokens(e.name) > self.threshold_tokens


DECIDERS: dict[str, Callable[[RouterConfig], PDDecider]] = {
    "uncached-tokens": lambda cfg: UncachedTokens(cfg.pd.prefill_threshold_tokens),
}


def build_decider(cfg: RouterConfig) -> PDDecider:
    return DECIDERS[cfg.pd.decider](cfg)
