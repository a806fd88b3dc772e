"""`spec.routing.flowControl`: tenants, priority bands, fair shares, quotas, queue bounds and
the API keys, as the pool states them. Mirrors the router's `flow_control`, `quotas` and
`queue` sections (router/kvfleet_router/config.py), which `decide/router_config.py`
renders from these types; the router's own checks run here too, so a pool the CRD accepts
is a config every router accepts.

Cross-field rules (the CRD's CEL rules on `flowControl` say the same): tenant names are
unique; a band's queue bound is at most the whole queue's (`maxQueued`, where set).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from kvfleet_router.config import (
    BAND_RANGE,
    BAND_VALUES,
    MAX_WEIGHT,
    TENANT_NAME_PATTERN,
    ConfigError,
    FlowControlConfig,
    QuotasConfig,
)
from pydantic import Field, GetCoreSchemaHandler, GetJsonSchemaHandler, model_validator
from pydantic_core import PydanticCustomError, core_schema

from .errors import SpecError
from .validation import Float, Int, Str, camel, spec_type

HEADER_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"
BAND_NAME_PATTERN = "^(" + "|".join(BAND_VALUES) + ")$"
# A band as a map key: a name, or an integer in BAND_RANGE written as a string.
BAND_KEY_PATTERN = "^(" + "|".join(BAND_VALUES) + r"|-?(100|[1-9]?[0-9]))$"
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
SECRET_KEY_PATTERN = r"^[-._a-zA-Z0-9]+$"
MAX_TENANTS = 256
MAX_QUEUED = 100_000
MAX_TTL_S = 3600


class _BandRule:
    """A priority band: critical, standard, sheddable, or an integer in BAND_RANGE (lower
    is served first), as the router's `band` (an int-or-string in the CRD)."""

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def check(value: Any) -> str | int:
            if isinstance(value, str) and re.fullmatch(BAND_NAME_PATTERN, value):
                return value
            if isinstance(value, int) and not isinstance(value, bool) \
                    and BAND_RANGE[0] <= value <= BAND_RANGE[1]:  # fmt: skip
                return value
            raise PydanticCustomError(
                "band", "must be one of {names} or an integer in [{low}, {high}], got {got}",
                {"names": ", ".join(BAND_VALUES), "low": BAND_RANGE[0],
                 "high": BAND_RANGE[1], "got": repr(value)})

        return core_schema.no_info_plain_validator_function(check)

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {"anyOf": [{"type": "integer"}, {"type": "string"}],
                "pattern": BAND_NAME_PATTERN, "minimum": BAND_RANGE[0],
                "maximum": BAND_RANGE[1], "x-kubernetes-int-or-string": True}


Band = Annotated[str | int, _BandRule()]
TenantName = Annotated[Str, Field(min_length=1, max_length=128, pattern=TENANT_NAME_PATTERN)]


@spec_type
class QuotaSpec:
    """Rate limits (token buckets); 0 is no limit."""

    rpm: Int = Field(default=0, ge=0, le=1_000_000_000)  # requests per minute
    tpm: Int = Field(default=0, ge=0, le=1_000_000_000_000)  # tokens per minute


@spec_type
class TenantSpec:
    name: TenantName
    band: Band = "standard"
    weight: Float = Field(default=1.0, gt=0, le=MAX_WEIGHT)
    quotas: QuotaSpec | None = None


@spec_type
class SecretKeyRef:
    """A key of a Secret in the pool's namespace."""

    name: Annotated[Str, Field(min_length=1, max_length=253, pattern=SECRET_NAME_PATTERN)]
    key: Str = Field(default="keys", min_length=1, max_length=253, pattern=SECRET_KEY_PATTERN)


@spec_type
class FlowControlSpec:
    tenant_header: Str = Field(default="x-kvfleet-tenant", pattern=HEADER_PATTERN,
                               max_length=128)
    default_tenant: Str = Field(default="default", min_length=1, max_length=128,
                                pattern=TENANT_NAME_PATTERN)
    default_band: Band = "standard"
    default_quotas: QuotaSpec | None = None
    tenants: list[TenantSpec] = Field(default_factory=list, max_length=MAX_TENANTS)
    max_queued: Int | None = Field(default=None, ge=0, le=MAX_QUEUED)
    # band (a name, or an integer as a string) -> requests it may hold queued
    max_queued_per_band: dict[Str, Annotated[Int, Field(ge=0, le=MAX_QUEUED)]] | None = \
        Field(default=None, max_length=16)
    queue_ttl_seconds: Float | None = Field(default=None, ge=0, le=MAX_TTL_S)
    api_keys_secret_ref: SecretKeyRef | None = None

    @model_validator(mode="after")
    def _consistent(self) -> FlowControlSpec:
        seen: set[str] = set()
        for i, t in enumerate(self.tenants):
            if t.name in seen:
                raise SpecError(f"tenants[{i}].name", f"duplicate tenant name {t.name!r}")
            seen.add(t.name)
        for band, bound in (self.max_queued_per_band or {}).items():
            if not re.fullmatch(BAND_KEY_PATTERN, band):
                raise SpecError("maxQueuedPerBand", f"keys are bands ({', '.join(BAND_VALUES)} "
                                f"or an integer in [{BAND_RANGE[0]}, {BAND_RANGE[1]}]), got "
                                f"{band!r}")
            if self.max_queued is not None and bound > self.max_queued:
                raise SpecError(f"maxQueuedPerBand.{band}", f"must be <= maxQueued "
                                f"({bound} > {self.max_queued})")
        try:  # the router's own rules, so every router takes what the CRD took
            FlowControlConfig(**self.router_flow_control())
            if (quotas := self.router_quotas()) is not None:
                QuotasConfig(**quotas)
        except ConfigError as exc:
            field, _, why = str(exc).partition(": ")
            raise SpecError(camel(field), why) from None
        return self

    def router_flow_control(self) -> dict[str, Any]:
        """The router config's `flow_control` section."""
        out: dict[str, Any] = {
            "tenant_header": self.tenant_header,
            "default_tenant": self.default_tenant,
            "default_band": self.default_band,
            "tenants": {t.name: {"band": t.band, "weight": float(t.weight)}
                        for t in self.tenants},
        }
        if self.max_queued_per_band:
            out["max_queued_per_band"] = dict(sorted(self.max_queued_per_band.items()))
        return out

    def router_quotas(self) -> dict[str, Any] | None:
        """The router config's `quotas` section, or None when no tenant has a limit."""
        tenants = {t.name: {"rpm": t.quotas.rpm, "tpm": t.quotas.tpm}
                   for t in self.tenants if t.quotas is not None}
        default = self.default_quotas or QuotaSpec()
        if not default.rpm and not default.tpm \
                and not any(q["rpm"] or q["tpm"] for q in tenants.values()):  # fmt: skip
            return None
        return {"default": {"rpm": default.rpm, "tpm": default.tpm}, "tenants": tenants}
