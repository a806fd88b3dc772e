"""The router's versioned configuration: what `router.yaml` holds and what the operator PUTs.

One document, schema `kvfleet.io/router/v1`, replaced as a whole (never patched):

```yaml
schema: kvfleet.io/router/v1     # optional; the only accepted value
version: 3                       # int >= 0; an admin push must be higher than the current
endpoints:                       # the backends; names are unique
  - name: e0
    url: http://127.0.0.1:8001   # http(s)://host:port, no path
    role: unified                # unified | prefill | decode
    state: active                # active | draining (draining: no new requests, in-flight finish)
    capacity: 256                # in-flight at which it is full; load = in-flight/capacity
    models: []                   # served model names; empty = any
    prefix_mode: approximate     # approximate (router hashes text) | precise (KV events)
    engine: unknown              # unknown | builtin | vllm; only builtin ones take peer hints
policy:
  name: cache-aware              # round-robin | random | least-request | least-kv | prefix-cache |
                                 # session | latency | ucb | slo | cache-aware
  picker: max                    # max | power-of-two | weighted-random (ignored by round-robin)
  weights: {prefix: 1.0, queue: 4.0, kv: 0.0}   # scorer -> weight (cache-aware only)
  allow_override: false          # honour the per-request header below?
  override_header: x-kvfleet-policy
  imbalance: {abs_threshold: 8, rel_threshold: 1.5}   # cache-aware's load guard
  ucb_c: 1.0                     # UCB1 exploration constant
  ttft_ref_s: 0.5                # reward = ttft_ref / (ttft_ref + ttft), in (0, 1]
  slo: {prefill_s_per_token: 0.0005, decode_s_per_token: 0.02, ewma_alpha: 0.2}
session: {header: x-session-id, use_user_field: true, load_factor: 1.25}
prefix: {block_bytes: 64, max_blocks_per_endpoint: 20000, chars_per_token: 4.0}
saturation: {max_waiting: 0, max_kv_usage: 0.98}    # 0 disables max_waiting
queue: {max_size: 256, timeout_s: 5.0, retry_after_s: 1}
health: {probe_interval_s: 2.0, probe_timeout_s: 1.0, eject_after_errors: 3,
         eject_base_s: 2.0, eject_max_s: 30.0}
signals: {poll_interval_s: 1.0, stale_after_s: 5.0}
timeouts: {connect_s: 10.0, first_byte_s: 60.0, idle_s: 60.0}   # connect: SYN retries
retries: {max_attempts: 2}       # total tries per request, only before the client saw a byte
pd: {decider: uncached-tokens,       # when a separate prefill leg runs (pd_deciders.py)
     prefill_threshold_tokens: 128}   # uncached prompt tokens above which it does
kv_sharing:                      # peer prefix hints (peer_hint.py); builtin + precise only
  enabled: false
  margin: 1.5                    # fetch only when fetch time x margin < recompute time
  min_gain_blocks: 2             # the peer must cache at least this many more blocks
  bandwidth_bytes_per_s: 1.0e9   # prior until the endpoint's peer fetches are measured
  latency_s: 0.002               # fixed cost of one fetch (request, headers, install)
  kv_bytes_per_token: 131072     # prior until a peer's exports are measured (Llama-3-8B bf16)
limits: {max_body_bytes: 4194304,   # client bodies; larger is 413
         body_read_timeout_s: 30.0,  # a whole client body must arrive within (else 408)
         max_uploads_per_client: 64} # unfinished client bodies per address (else 429)
```

Every number has a range (`num(...)` below; NaN and infinities are never in one), and a
number outside it is refused with the field and the range: `health.probe_interval_s: must be
a finite number in [0.1, 3600], got 1e-09`. All policy weights zero is refused too.

`RouterConfig.from_dict(data)` checks everything and raises `ConfigError` whose message starts
with the field path (`endpoints[1].role: must be one of ...`). `to_dict()` is the inverse.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kvfleet_engine.contract.http_limits import (
    DEFAULT_BODY_READ_TIMEOUT_S,
    DEFAULT_MAX_UPLOADS_PER_CLIENT,
)

SCHEMA = "kvfleet.io/router/v1"
ROLES = ("unified", "prefill", "decode")
STATES = ("active", "draining")
PREFIX_MODES = ("approximate", "precise")
ENGINE_KINDS = ("unknown", "builtin", "vllm")  # what runs behind an endpoint
POLICY_NAMES = (
    "round-robin", "random", "least-request", "least-kv", "prefix-cache",
    "session", "latency", "ucb", "slo", "cache-aware",
)
PICKER_NAMES = ("max", "power-of-two", "weighted-random")
SCORER_NAMES = ("prefix", "queue", "kv", "session", "latency", "ucb", "slo")
PD_DECIDER_NAMES = ("uncached-tokens",)


class ConfigError(ValueError):
    """A config problem; the message starts with the offending field's path."""


def _check(cond: bool, path: str, message: str) -> None:
    if not cond:
        raise ConfigError(f"{path}: {message}")


@dataclass(frozen=True, slots=True)
class Range:
    low: float
    high: float
    is_low_open: bool = False  # (low, high] instead of [low, high]

    def __str__(self) -> str:
        low, high = (int(x) if float(x).is_integer() else x for x in (self.low, self.high))
        return f"{'(' if self.is_low_open else '['}{low}, {high}]"

    def contains(self, value: float) -> bool:
        if not math.isfinite(value) or value > self.high:
            return False
        return value > self.low if self.is_low_open else value >= self.low


def num(default: float, low: float, high: float, *, is_low_open: bool = False) -> Any:
    """A numeric config field with its range (checked by `check_ranges`)."""
    return field(default=default, metadata={"range": Range(low, high, is_low_open)})


def check_ranges(obj: Any) -> None:
    """Every numeric field of a config dataclass lies in its declared range."""
    for f in dataclasses.fields(obj):
        rng = f.metadata.get("range")
        if rng is None:
            continue
        value = getattr(obj, f.name)
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        kind = "an integer" if f.type == "int" else "a finite number"
        _check(is_number and rng.contains(value), f.name, f"must be {kind} in {rng}, got {value!r}")


HOUR_S = 3600.0
MAX_WEIGHT = 1000.0
MAX_BODY_BYTES_CEILING = 64 * 1024 * 1024  # limits.max_body_bytes at most (and aiohttp's cap)


@dataclass(slots=True)
class EndpointConfig:
    name: str
    url: str
    role: str = "unified"
    state: str = "active"
    capacity: int = num(256, 1, 1_000_000)
    models: list[str] = field(default_factory=list)
    prefix_mode: str = "approximate"
    engine: str = "unknown"

    def __post_init__(self) -> None:
        _check(bool(self.name), "name", "must not be empty")
        parts = urlsplit(self.url)
        _check(parts.scheme in ("http", "https") and bool(parts.hostname) and parts.path in
               ("", "/"), "url", f"must look like http://host:port, got {self.url!r}")
        self.url = self.url.rstrip("/")
        _check(self.role in ROLES, "role", f"must be one of {', '.join(ROLES)}")
        _check(self.state in STATES, "state", f"must be one of {', '.join(STATES)}")
        check_ranges(self)
        _check(self.prefix_mode in PREFIX_MODES, "prefix_mode",
               f"must be one of {', '.join(PREFIX_MODES)}")
        _check(self.engine in ENGINE_KINDS, "engine", f"must be one of {', '.join(ENGINE_KINDS)}")

    @property
    def is_draining(self) -> bool:
        return self.state == "draining"


@dataclass(slots=True)
class ImbalanceConfig:
    abs_threshold: float = num(8.0, 0, 1_000_000)
    rel_threshold: float = num(1.5, 1, 1000)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(slots=True)
class SloConfig:
    prefill_s_per_token: float = num(0.0005, 0, 10, is_low_open=True)  # prior for alpha
    decode_s_per_token: float = num(0.02, 0, 60, is_low_open=True)  # prior for beta
    ewma_alpha: float = num(0.2, 0, 1, is_low_open=True)

    def __post_init__(self) -> None:
        check_ranges(self)


def _default_weights() -> dict[str, float]:
    # Chosen in the simulator on the Mooncake trace (bench/sim_policies.md, "Tuning the
    # default weights"): queue scores the free share of capacity, so at 4 a full prefix hit
    # (1.0) outweighs a load gap of a quarter of capacity and load decides beyond that. The
    # kv score lags one scrape and mostly restates the queue; weighted in, it lowered both
    # hit rate and SLO attainment there, so it is off (the saturation filter still reads KV).
    return {"prefix": 1.0, "queue": 4.0, "kv": 0.0}


@dataclass(slots=True)
class PolicyConfig:
    name: str = "cache-aware"
    picker: str = "max"
    weights: dict[str, float] = field(default_factory=_default_weights)
    allow_override: bool = False
    override_header: str = "x-kvfleet-policy"
    imbalance: ImbalanceConfig = field(default_factory=ImbalanceConfig)
    ucb_c: float = num(1.0, 0, 100)
    ttft_ref_s: float = num(0.5, 0, HOUR_S, is_low_open=True)
    slo: SloConfig = field(default_factory=SloConfig)

    def __post_init__(self) -> None:
        _check(self.name in POLICY_NAMES, "name", f"must be one of {', '.join(POLICY_NAMES)}")
        _check(self.picker in PICKER_NAMES, "picker", f"must be one of {', '.join(PICKER_NAMES)}")
        for key, weight in self.weights.items():
            _check(key in SCORER_NAMES, f"weights.{key}",
                   f"unknown scorer; known: {', '.join(SCORER_NAMES)}")
            _check(isinstance(weight, int | float) and not isinstance(weight, bool) and
                   math.isfinite(weight) and 0 <= weight <= MAX_WEIGHT, f"weights.{key}",
                   f"must be a finite number in [0, {MAX_WEIGHT:g}], got {weight!r}")
        _check(any(self.weights.values()), "weights",
               "at least one weight must be > 0 (all zero ranks every endpoint the same)")
        check_ranges(self)
        _check(bool(self.override_header), "override_header", "must not be empty")


@dataclass(slots=True)
class SessionConfig:
    header: str = "x-session-id"
    use_user_field: bool = True
    load_factor: float = num(1.25, 1, 100)  # bounded-load hashing: cap = factor * mean load

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(slots=True)
class PrefixConfig:
    block_bytes: int = num(64, 1, 1 << 20)
    max_blocks_per_endpoint: int = num(20000, 1, 10_000_000)
    chars_per_token: float = num(4.0, 0.1, 64)  # prompt tokens from text, no tokenizer

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(slots=True)
class SaturationConfig:
    max_waiting: int = num(0, 0, 1_000_000)  # engine-reported waiting requests; 0 disables
    max_kv_usage: float = num(0.98, 0, 1, is_low_open=True)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(slots=True)
class QueueConfig:
    max_size: int = num(256, 0, 100_000)
    timeout_s: float = num(5.0, 0, HOUR_S)
    retry_after_s: int = num(1, 0, HOUR_S)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(slots=True)
class HealthConfig:
    probe_interval_s: float = num(2.0, 0.1, HOUR_S)
    probe_timeout_s: float = num(1.0, 0.01, 600)
    eject_after_errors: int = num(3, 1, 1000)
    eject_base_s: float = num(2.0, 0.01, HOUR_S)
    eject_max_s: float = num(30.0, 0.01, 24 * HOUR_S)

    def __post_init__(self) -> None:
        check_ranges(self)
        _check(self.eject_max_s >= self.eject_base_s, "eject_max_s", "must be >= eject_base_s")


@dataclass(slots=True)
class SignalsConfig:
    poll_interval_s: float = num(1.0, 0.1, HOUR_S)
    stale_after_s: float = num(5.0, 0.1, 24 * HOUR_S)

    def __post_init__(self) -> None:
        check_ranges(self)
        _check(self.stale_after_s >= self.poll_interval_s, "stale_after_s",
               "must be >= poll_interval_s")


@dataclass(slots=True)
class TimeoutsConfig:
    connect_s: float = num(10.0, 0.01, 600)  # a refused connect fails at once; SYN retries
    first_byte_s: float = num(60.0, 0.01, HOUR_S)
    idle_s: float = num(60.0, 0.01, HOUR_S)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(slots=True)
class RetriesConfig:
    max_attempts: int = num(2, 1, 10)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(slots=True)
class PDConfig:
    decider: str = "uncached-tokens"
    prefill_threshold_tokens: int = num(128, 0, 10_000_000)

    def __post_init__(self) -> None:
        check_ranges(self)
        _check(self.decider in PD_DECIDER_NAMES, "decider",
               f"must be one of {', '.join(PD_DECIDER_NAMES)}")


@dataclass(slots=True)
class KVSharingConfig:
    """Peer prefix hints: when to let an endpoint fetch a prompt's cached prefix from the
    peer that holds it instead of recomputing it (`peer_hint.decide_peer_hint`). The
    prefill-rate prior is `policy.slo.prefill_s_per_token`, the SLO scorer's."""

    enabled: bool = False
    margin: float = num(1.5, 1, 100)
    min_gain_blocks: int = num(2, 1, 1_000_000)
    bandwidth_bytes_per_s: float = num(1e9, 0, 1e13, is_low_open=True)
    latency_s: float = num(0.002, 0, 60)
    kv_bytes_per_token: float = num(131072.0, 0, 1 << 30, is_low_open=True)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(slots=True)
class LimitsConfig:
    max_body_bytes: int = num(4 * 1024 * 1024, 1, MAX_BODY_BYTES_CEILING)
    body_read_timeout_s: float = num(DEFAULT_BODY_READ_TIMEOUT_S, 0.1, HOUR_S)
    max_uploads_per_client: int = num(DEFAULT_MAX_UPLOADS_PER_CLIENT, 1, 100_000)

    def __post_init__(self) -> None:
        check_ranges(self)


@dataclass(slots=True)
class RouterConfig:
    version: int = num(0, 0, 2**63 - 1)
    endpoints: list[EndpointConfig] = field(default_factory=list)
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    prefix: PrefixConfig = field(default_factory=PrefixConfig)
    saturation: SaturationConfig = field(default_factory=SaturationConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    health: HealthConfig = field(default_factory=HealthConfig)
    signals: SignalsConfig = field(default_factory=SignalsConfig)
    timeouts: TimeoutsConfig = field(default_factory=TimeoutsConfig)
    retries: RetriesConfig = field(default_factory=RetriesConfig)
    pd: PDConfig = field(default_factory=PDConfig)
    kv_sharing: KVSharingConfig = field(default_factory=KVSharingConfig)
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    schema: str = SCHEMA

    def __post_init__(self) -> None:
        _check(self.schema == SCHEMA, "schema", f"must be {SCHEMA!r}")
        check_ranges(self)
        seen: set[str] = set()
        for i, ep in enumerate(self.endpoints):
            _check(ep.name not in seen, f"endpoints[{i}].name", f"duplicate name {ep.name!r}")
            seen.add(ep.name)

    @classmethod
    def from_dict(cls, data: Any) -> RouterConfig:
        cfg = _build(cls, data, "")
        assert isinstance(cfg, RouterConfig)
        return cfg

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# --- generic dict -> dataclass conversion with field-path errors ---

_NESTED: dict[str, type] = {
    "policy": PolicyConfig, "imbalance": ImbalanceConfig, "slo": SloConfig,
    "session": SessionConfig, "prefix": PrefixConfig, "saturation": SaturationConfig,
    "queue": QueueConfig, "health": HealthConfig, "signals": SignalsConfig,
    "timeouts": TimeoutsConfig, "retries": RetriesConfig, "pd": PDConfig,
    "kv_sharing": KVSharingConfig, "limits": LimitsConfig,
}
_SCALARS: dict[str, tuple[type, ...]] = {
    "int": (int,), "float": (int, float), "str": (str,), "bool": (bool,),
}


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _coerce(value: Any, type_name: str, path: str) -> Any:
    if type_name in _SCALARS:
        ok = isinstance(value, _SCALARS[type_name])
        if type_name in ("int", "float") and isinstance(value, bool):
            ok = False
        _check(ok, path, f"must be {type_name}, got {type(value).__name__}")
        if type_name == "float":
            try:
                return float(value)
            except OverflowError:  # an int too large for a double
                raise ConfigError(f"{path}: must be a finite number, got an integer of "
                                  f"{len(str(abs(value)))} digits") from None
        return value
    if type_name == "list[str]":
        _check(isinstance(value, list) and all(isinstance(v, str) for v in value), path,
               "must be a list of strings")
        return list(value)
    if type_name == "dict[str, float]":
        _check(isinstance(value, dict), path, "must be a mapping")
        for key, item in value.items():
            _check(isinstance(item, int | float) and not isinstance(item, bool) and
                   abs(item) <= MAX_WEIGHT, _join(path, str(key)),
                   f"must be a number in [0, {MAX_WEIGHT:g}]")
        return {str(k): float(v) for k, v in value.items()}
    raise AssertionError(f"unhandled type {type_name}")  # a schema bug, not bad input


def _build(cls: type, data: Any, path: str) -> Any:
    _check(isinstance(data, dict), path or "<root>", "must be a mapping")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for key in data:
        _check(key in fields, _join(path, str(key)), "unknown field")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        fpath = _join(path, name)
        type_name = str(fields[name].type)
        if name == "endpoints":
            _check(isinstance(value, list), fpath, "must be a list")
            kwargs[name] = [_build(EndpointConfig, item, f"{fpath}[{i}]")
                            for i, item in enumerate(value)]
        elif name in _NESTED and type_name not in _SCALARS:
            kwargs[name] = _build(_NESTED[name], value, fpath)
        else:
            kwargs[name] = _coerce(value, type_name, fpath)
    for name, f in fields.items():
        if name not in kwargs and f.default is dataclasses.MISSING and \
                f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{_join(path, name)}: required")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        # __post_init__ reports a path relative to its own dataclass.
        if path:
            raise ConfigError(f"{path}.{exc}") from None
        raise


def load_file(path: str) -> RouterConfig:
    """Read a YAML (or JSON) file; every problem becomes one ConfigError line."""
    import yaml

    try:
        with open(path, encoding="utf-8") as fh:
            data = yaml.safe_load(fh)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        data = {}
    try:
        return RouterConfig.from_dict(data)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
