"""The prefill -> decode KV hand-off in virtual time: bytes over a link plus a fixed latency.

A disaggregated request follows the router's own P/D plan (`kvfleet_router.pd_plan`, which
the router's `pd.py` runs too): decode is picked first, the pool's P/D decider
(`pd_deciders`, default `uncached-tokens`) says whether a prefill leg runs, the prefill
replica computes the prompt with `max_tokens=1` and holds its blocks, and the decode
replica starts once the KV has arrived:

    seconds = latency_s + num_tokens * bytes_per_token / bytes_per_s

`bytes_per_token` comes from the cost profile's model (2 x layers x KV heads x head dim x
dtype bytes: K and V); the link is a setting (default 50 GB/s, a 400 Gb/s RDMA NIC, and
2 ms). The prefill replica keeps the blocks until the transfer ends.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvfleet_engine.runners.cost_model import CostProfile


class HandoffError(ValueError):
    """A profile without the model shape a KV hand-off needs."""


@dataclass(slots=True, frozen=True)
class Handoff:
    bytes_per_token: int
    bytes_per_s: float = 50e9
    latency_s: float = 0.002

    def __post_init__(self) -> None:
        if not (self.bytes_per_token > 0 and self.bytes_per_s > 0 and self.latency_s >= 0):
            raise HandoffError("KV hand-off needs bytes per token and bandwidth > 0, latency >= 0")

    def seconds(self, num_tokens: int) -> float:
        return self.latency_s + num_tokens * self.bytes_per_token / self.bytes_per_s


def kv_bytes_per_token(profile: CostProfile) -> int:
    m = profile.model
    try:
        n = 2 * int(m["num_layers"]) * int(m["num_kv_heads"]) * int(m["head_dim"])
        return n * int(m["dtype_bytes"])
    except (KeyError, TypeError, ValueError):
        raise HandoffError(
            f"profile {profile.name!r} has no model shape (num_layers, num_kv_heads, head_dim, "
            "dtype_bytes), so a prefill/decode pool cannot be simulated with it"
        ) from None
