"""Routing policies: filters, scorers, pickers and named mixes, all pure and importable.

Entry point for benchmarks and the simulator:

    from kvfleet_router.config import RouterConfig, EndpointConfig
    from kvfleet_router.endpoint import EndpointState
    from kvfleet_router.policies import build_policy, RouteContext
    from kvfleet_router.router_core import RouterCore   # registry + prefix indexes + these

See filters.py, scorers.py, pickers.py (each docstring lists formulas) and policy.py.
"""

from kvfleet_router.policies.context import RouteContext
from kvfleet_router.policies.filters import FILTERS
from kvfleet_router.policies.guard import imbalance_ratio, is_imbalanced
from kvfleet_router.policies.pickers import PICKERS
from kvfleet_router.policies.policy import (
    POLICIES,
    PRESETS,
    Decision,
    Policy,
    build_policies,
    build_policy,
)
from kvfleet_router.policies.scorers import SCORERS

__all__ = ["FILTERS", "PICKERS", "POLICIES", "SCORERS", "Decision", "Policy", "RouteContext",
           "build_policy", "build_policies", "PRESETS", "imbalance_ratio", "is_imbalanced"]
