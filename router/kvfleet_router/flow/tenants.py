"""Tenants: their band and weight, the band a request lands in, capped metric labels.

A tenant named in `flow_control.tenants` has its band and weight; any other tenant id is
its own tenant in `default_band` with weight 1; a request without the tenant header
belongs to `default_tenant`. A request's own priority (x-kvfleet-priority or the body's
`priority`, lower first as in vLLM) never lifts it above its tenant's band: a positive
priority moves it down to at least `sheddable`, zero or negative ones only order it among
its tenant's own requests.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvfleet_router.config import BAND_VALUES, FlowControlConfig, band_value

SHEDDABLE = BAND_VALUES["sheddable"]
OTHER = "other"
_NAMES = {v: k for k, v in BAND_VALUES.items()}


@dataclass(slots=True, frozen=True)
class Flow:
    """One request's flow-control standing: its tenant, band, tenant weight, the base of
    the `priority` its engine gets (`engine_priority`), and its metric labels."""

    tenant: str
    band: int
    weight: float
    engine_priority: int
    label: str  # the tenant's metric label
    band_label: str


def request_flow(cfg: FlowControlConfig, tenant: str, priority: int, label: str) -> Flow:
    tenant_band, weight = tenant_share(cfg, tenant)
    band = request_band(tenant_band, priority)
    return Flow(tenant, band, weight, engine_priority(tenant_band, priority), label,
                band_label(band))


def tenant_share(cfg: FlowControlConfig, tenant: str) -> tuple[int, float]:
    """(band, weight) of `tenant`."""
    t = cfg.tenants.get(tenant)
    if t is None:
        return band_value(cfg.default_band), 1.0
    return band_value(t.band), t.weight


def request_band(tenant_band: int, priority: int) -> int:
    """The band a request waits in: its tenant's, or lower (sheddable) when it asks."""
    return max(tenant_band, SHEDDABLE) if priority > 0 else tenant_band


def engine_priority(tenant_band: int, priority: int) -> int:
    """The base of the `priority` the engine gets (lower runs first): the tenant's band,
    or the request's own positive priority when that is lower still. No request promotes
    itself. The engine gets the request's standing on its endpoint (`seats.standing`:
    twice this, less one while the tenant is under its share there)."""
    return max(tenant_band, priority) if priority > 0 else tenant_band


def band_label(band: int) -> str:
    return _NAMES.get(band, str(band))


class TenantLabels:
    """Tenant -> metric label, at most `max_labels` unconfigured tenants by name (the
    first ones seen; a label once given is kept, so no series flaps), configured tenants
    always, everyone else `other`."""

    def __init__(self, max_labels: int) -> None:
        self.max_labels = max_labels
        self._given: set[str] = set()

    def label(self, tenant: str, cfg: FlowControlConfig) -> str:
        if tenant in self._given or tenant in cfg.tenants:
            return tenant
        if len(self._given) < self.max_labels:
            self._given.add(tenant)
            return tenant
        return OTHER
