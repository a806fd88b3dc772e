"""The set of endpoints, replaced atomically on each config and never losing a counter.

An endpoint keeps its state object (in-flight count, EWMAs, breaker) across reloads as
long as its name and URL stay; requests hold a reference to that object, so a reload can
never orphan their bookkeeping. Endpoints dropped from the config move to `retired` until
their last in-flight request ends.
"""

from __future__ import annotations

from kvfleet_router.config import RouterConfig
from kvfleet_router.endpoint import EndpointState


class Registry:
    def __init__(self) -> None:
        self.by_name: dict[str, EndpointState] = {}
        self.endpoints: list[EndpointState] = []  # config order; swapped, never mutated
        self.retired: list[EndpointState] = []

    def apply(self, cfg: RouterConfig) -> list[EndpointState]:
        """Install `cfg.endpoints`; returns the endpoint objects that left the config."""
        new: dict[str, EndpointState] = {}
        gone: list[EndpointState] = []
        alpha, forget = cfg.policy.slo.ewma_alpha, cfg.policy.slo.forget
        for ec in cfg.endpoints:
            old = self.by_name.get(ec.name)
            if old is not None and old.url == ec.url:
                old.apply_config(ec)
                old.apply_learning(alpha, forget)
                b = old.breaker
                b.eject_after_errors = cfg.health.eject_after_errors
                b.eject_base_s, b.eject_max_s = cfg.health.eject_base_s, cfg.health.eject_max_s
                new[ec.name] = old
            else:
                new[ec.name] = EndpointState.from_config(ec, cfg.health, alpha, forget)
        for name, old in self.by_name.items():
            if new.get(name) is not old:
                old.is_removed = True
                gone.append(old)
        self.retired = [e for e in self.retired + gone if e.num_in_flight > 0]
        self.by_name = new
        self.endpoints = list(new.values())
        return gone

    def prune_retired(self) -> None:
        if self.retired:
            self.retired = [e for e in self.retired if e.num_in_flight > 0]

    def all_endpoints(self) -> list[EndpointState]:
        """Configured plus retired-but-busy endpoints (for GET /admin/config and metrics)."""
        self.prune_retired()
        return self.endpoints + self.retired
