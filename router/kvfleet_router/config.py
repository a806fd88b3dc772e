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
    capacity: 256                # in-flight at which it is full (saturation); the queue scorer
                                 # scores 1 - depth / capacity
    models: []                   # served model names; empty = any
    prefix_mode: approximate     # approximate (router hashes text) | precise (KV events)
    engine: unknown              # unknown | builtin | vllm; only builtin ones take peer hints
    revision: ""                 # the engine revision it runs ("" none; [a-z0-9-], <= 63)
revisions:                       # optional: split new requests between revisions (a canary)
  weights: {a1b2c3d4e5: 95, f6a7b8c9d0: 5}   # revision -> 0..100; one at least > 0; a
                                 # revision at 0 (or not listed) gets no new requests while
                                 # a listed one can serve (revisions.py). Absent: no split.
policy:
  name: cache-aware              # round-robin | random | least-request | least-kv | prefix-cache |
                                 # session | latency | ucb | slo | backlog | cache-aware (the
                                 # presets), or a key of `pipelines`
  picker: max                    # max | power-of-two | weighted-random: the presets that rank
                                 # (round-robin, random and slo keep their own)
  weights: {prefix: 1.0, queue: 4.0, kv: 0.0}   # scorer -> weight (cache-aware only)
  prefill_weights: {prefix: 1.0, queue: 4.0, backlog: 4.0}   # cache-aware's, P/D prefill legs
  allow_override: false          # honour the per-request header below?
  override_header: x-kvfleet-policy
  imbalance: {abs_threshold: 8, rel_threshold: 1.5}   # cache-aware's load guard
  min_prefix_match: 0.1          # a prefix match covering less of the prompt scores 0
  ucb_c: 1.0                     # UCB1 exploration constant
  load_factor: 1.25              # bounded load of latency/ucb/slo/least-kv
  ttft_ref_s: 0.5                # reward = ttft_ref / (ttft_ref + ttft), in (0, 1]
  slo: {prefill_s_per_token: 0.0005, decode_s_per_token: 0.02, ewma_alpha: 0.2,
        ttft_s: 2.0, tpot_s: 0.05,   # targets unless the request's headers set them
        headroom: 0.2, min_samples: 32, forget: 0.995, output_tokens_prior: 256}
  pipelines: {}                  # name -> a policy composed here (policies/policy.py), e.g.
  #   my-mix: {filters: [bounded-load],          # optional filters (eligibility + saturation
  #                                              # always run first)
  #            scorers: {prefix: 1.0, queue: 4.0},   # scorer -> weight, summed
  #            picker: max,                      # max | power-of-two | weighted-random |
  #                                              # round-robin | slo-tiered
  #            guard: true}                      # policy.imbalance: queue only while it trips
session: {header: x-session-id, use_user_field: true, load_factor: 1.25}
prefix: {block_bytes: 64, max_blocks_per_endpoint: 65536, chars_per_token: 4.0,
         tokenizer: {path: "", chat: true, offload_chars: 4096}}  # text -> token ids for
                                 # precise endpoints; path: folder of tokenizer.json ("" = off)
saturation: {max_waiting: 0, max_kv_usage: 0.98}    # 0 disables max_waiting
queue: {max_size: 256, timeout_s: 5.0, retry_after_s: 1}
health: {probe_interval_s: 2.0, probe_timeout_s: 1.0, eject_after_errors: 3,
         eject_base_s: 2.0, eject_max_s: 30.0}
signals: {poll_interval_s: 1.0, stale_after_s: 5.0}
timeouts: {connect_s: 10.0, first_byte_s: 60.0, idle_s: 60.0}   # connect: SYN retries
retries: {max_attempts: 2}       # total tries per request, only before the client saw a byte
migration:                       # a stream whose endpoint breaks after the first byte
  enabled: true                  # continues on another endpoint (migration.py)
  max_migrations: 2              # continuations per request; then the stream ends in an error
  token_ids: true                # ask engines for token ids (vLLM >= 0.10.2: return_token_ids)
                                 # and continue from them, token-exact; else from the text
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
quotas:                          # per-tenant rate limits (quota.py; router/README.md)
  default: {rpm: 0, tpm: 0}      # tenants not listed; 0 = no limit (the default: off)
  tenants: {}                    # name -> {rpm: requests/min, tpm: tokens/min}
  burst_s: 2.0                   # bucket depth: this many seconds of the limit
  default_max_tokens: 256        # charged up front when a request sets no max_tokens
  max_tracked_tenants: 10000     # buckets kept (full ones dropped first, then the fullest)
flow_control:                    # tenants, bands, fair shares (flow/; router/README.md)
  tenant_header: x-kvfleet-tenant
  default_tenant: default        # requests without the header
  default_band: standard         # unconfigured tenants (weight 1 each)
  tenants: {}                    # name -> {band: critical|standard|sheddable|<int>, weight: 1}
  max_queued_per_band: {}        # band -> bound (queue.max_size bounds them all)
  service_window_s: 60           # attained-service decay (weighted least attained service)
  max_tenant_labels: 20          # tenants with their own metric label; the rest: other
  max_tracked_tenants: 10000     # tenants whose served tokens are kept (least served forgotten)
  forward_priority: true         # the band as the body's `priority` (not to vLLM unless
  forward_priority_to_vllm: false  # it runs --scheduling-policy priority)
exchange:                        # share state among the pool's router replicas (exchange.py)
  enabled: false                 # the operator turns it on for routing.replicas > 1
  peers: []                      # static peers http://host:port (yourself is skipped by id)
  peers_dns: ""                  # "host:port": every address of host is a peer (headless Service)
  refresh_s: 5.0                 # re-resolve peers_dns this often
  interval_s: 0.1                # push what was recorded since the last push this often
  max_batch_blocks: 65536        # recorded blocks per push (older ones dropped, counted)
  stale_after_s: 2.0             # a peer's in-flight counts count this long after its push
  timeout_s: 0.5                 # one push or snapshot pull
  warm: true                     # on start, copy the index and sessions from a peer
```

The document is validated by pydantic: each field declares its type, default and range once
(`Field(ge=..., le=...)`; NaN and infinities are never in a range), cross-field rules are model
validators, and `json_schema()` derives the JSON Schema from the same declarations. A number
outside its range is refused with the field and the range: `health.probe_interval_s: must be
a finite number in [0.1, 3600], got 1e-09`. All policy weights zero is refused too.

`RouterConfig.from_dict(data)` checks everything and raises `ConfigError` whose message starts
with the field path (`endpoints[1].role: must be one of unified, prefill, decode; got 'boss'`);
building a config class in code checks the same way. `to_dict()` is the inverse.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable
from types import NoneType, UnionType
from typing import Annotated, Any, TypeVar, Union, dataclass_transform, get_args, get_origin
from urllib.parse import urlsplit

import annotated_types as at
from kvfleet_engine.contract.http_limits import (
    DEFAULT_BODY_READ_TIMEOUT_S,
    DEFAULT_MAX_UPLOADS_PER_CLIENT,
)
from pydantic import (
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    Strict,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.dataclasses import dataclass as pydantic_dataclass
from pydantic.fields import FieldInfo
from pydantic_core import PydanticCustomError, core_schema

SCHEMA = "kvfleet.io/router/v1"
ROLES = ("unified", "prefill", "decode")
STATES = ("active", "draining")
PREFIX_MODES = ("approximate", "precise")
ENGINE_KINDS = ("unknown", "builtin", "vllm")  # what runs behind an endpoint
POLICY_NAMES = (
    "round-robin", "random", "least-request", "least-kv", "prefix-cache",
    "session", "latency", "ucb", "slo", "backlog", "cache-aware",
)
PICKER_NAMES = ("max", "power-of-two", "weighted-random")  # policy.picker (the presets')
PIPELINE_PICKER_NAMES = (*PICKER_NAMES, "round-robin", "slo-tiered")
SCORER_NAMES = ("prefix", "queue", "pending", "backlog", "kv", "session", "latency", "ucb",
                "slo", "space")
# A pipeline lists only the filters that change what it trades: eligibility (healthy,
# not-draining, role, model) and saturation run in every policy, so none can drop them.
PIPELINE_FILTER_NAMES = ("bounded-load",)
# Scorers that bound load themselves: queue is load; pending is the part of it still to be
# prefilled (each request sent raises its endpoint's count at once, until its first byte);
# session caps each endpoint's share. Any other (affinity, learned, scraped) herds without
# the bounded-load filter or the guard; backlog too: a cached prompt adds little prefill
# work, so requests sharing a prefix would all go where it is cached.
LOAD_AWARE_SCORERS = frozenset({"queue", "pending", "session"})
PIPELINE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
PD_DECIDER_NAMES = ("uncached-tokens",)
REVISION_PATTERN = r"^[a-z0-9-]{1,63}$"  # an engine revision (decide.rollout.revision_of)


class ConfigError(ValueError):
    """A config problem; the message starts with the offending field's path."""


# --- field types: JSON's scalars, strictly (no "7" for 7, no true for 1) ---

Int = Annotated[int, Strict()]
Float = Annotated[float, Strict()]  # an int is accepted and becomes a float
Bool = Annotated[bool, Strict()]
Str = Annotated[str, Strict()]


@dataclasses.dataclass(frozen=True, slots=True)
class OneOf:
    """A string field's allowed values: checked, and the `enum` of the JSON Schema. `values`
    may be a function, read at each check, for names that plugins register."""

    values: tuple[str, ...] | Callable[[], tuple[str, ...]]
    what: str = "value"  # the noun in a map key's error: "unknown scorer; known: ..."

    def allowed(self) -> tuple[str, ...]:
        return self.values() if callable(self.values) else self.values

    def __get_pydantic_core_schema__(self, source: Any,
                                     handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        def check(value: str) -> str:
            if value not in self.allowed():
                raise PydanticCustomError("enum", "must be one of {allowed}",
                                          {"allowed": ", ".join(self.allowed()),
                                           "what": self.what})
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(self, schema: core_schema.CoreSchema,
                                     handler: GetJsonSchemaHandler) -> dict[str, Any]:
        return {**handler(schema), "enum": list(self.allowed())}


HOUR_S = 3600.0
MAX_WEIGHT = 1000.0
MAX_BODY_BYTES_CEILING = 64 * 1024 * 1024  # limits.max_body_bytes at most (and aiohttp's cap)

Weight = Annotated[float, Strict(), Field(ge=0, le=MAX_WEIGHT)]
ScorerName = Annotated[str, Strict(), OneOf(SCORER_NAMES, what="scorer")]

_C = TypeVar("_C")


@dataclass_transform(field_specifiers=(Field,))
def config_type(cls: type[_C]) -> type[_C]:
    """A config dataclass, validated by pydantic whether built by `from_dict` or in code;
    in code, a problem raises ConfigError with the path relative to the class."""
    out: Any = pydantic_dataclass(cls, config=ConfigDict(extra="forbid", allow_inf_nan=False),
                                  slots=True)
    init = out.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            init(self, *args, **kwargs)
        except ValidationError as exc:
            raise config_error(exc, out) from None

    out.__init__ = __init__
    return out  # type: ignore[no-any-return]


@config_type
class EndpointConfig:
    name: Annotated[Str, Field(min_length=1)]
    url: Str
    role: Annotated[Str, OneOf(ROLES)] = "unified"
    state: Annotated[Str, OneOf(STATES)] = "active"
    capacity: Int = Field(default=256, ge=1, le=1_000_000)
    models: list[Str] = Field(default_factory=list)
    prefix_mode: Annotated[Str, OneOf(PREFIX_MODES)] = "approximate"
    engine: Annotated[Str, OneOf(ENGINE_KINDS)] = "unknown"
    # The engine revision the endpoint runs ("" = none; `revisions` splits traffic by it).
    revision: Annotated[Str, Field(pattern=r"^[a-z0-9-]{0,63}$")] = ""

    @field_validator("url")
    @classmethod
    def _host_and_port(cls, url: str) -> str:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname \
                or parts.path not in ("", "/"):  # fmt: skip
            raise PydanticCustomError("url", "must look like http://host:port, got {url!r}",
                                      {"url!r": repr(url)})
        return url.rstrip("/")

    @property
    def is_draining(self) -> bool:
        return self.state == "draining"


@config_type
class ImbalanceConfig:
    abs_threshold: Float = Field(default=8.0, ge=0, le=1_000_000)
    rel_threshold: Float = Field(default=1.5, ge=1, le=1000)


@config_type
class SloConfig:
    prefill_s_per_token: Float = Field(default=0.0005, gt=0, le=10)  # prior for alpha
    decode_s_per_token: Float = Field(default=0.02, gt=0, le=60)  # prior for beta
    ewma_alpha: Float = Field(default=0.2, gt=0, le=1)
    # The predictive `slo` policy (perf_model.py): targets when the request carries none
    # (x-kvfleet-slo-ttft-ms / x-kvfleet-slo-tpot-ms), the headroom a prediction must
    # leave under them, the perf model's evidence rule and forgetting, and the output
    # length assumed before any answer from the model or session was seen.
    ttft_s: Float = Field(default=2.0, gt=0, le=HOUR_S)
    tpot_s: Float = Field(default=0.05, gt=0, le=60)
    headroom: Float = Field(default=0.2, ge=0, le=0.9)
    min_samples: Int = Field(default=32, ge=1, le=1_000_000)
    forget: Float = Field(default=0.995, gt=0.5, le=1)
    output_tokens_prior: Float = Field(default=256.0, ge=1, le=1_000_000)


def _default_weights() -> dict[str, float]:
    # Chosen in the simulator on the Mooncake trace (bench/sim_policies.md, "Tuning the
    # default weights"): queue scores the free share of capacity, so at 4 a full prefix hit
    # (1.0) outweighs a load gap of a quarter of capacity and load decides beyond that. The
    # kv score lags one scrape and mostly restates the queue; weighted in, it lowered both
    # hit rate and SLO attainment there, so it is off (the saturation filter still reads KV).
    return {"prefix": 1.0, "queue": 4.0, "kv": 0.0}


# The `backlog` preset's weights (policies/policy.py): the default's plus the prefill work
# queued in tokens, at the queue's weight.
BACKLOG_WEIGHTS = {"prefix": 1.0, "queue": 4.0, "backlog": 4.0}


def _default_prefill_weights() -> dict[str, float]:
    # A prefill-only endpoint's wait is the prompt work queued ahead of a request there,
    # in tokens: the backlog scorer's unit, which the request count of the queue scorer
    # does not see (one 40k-token prompt counts as one request, like a 200-token one).
    return dict(BACKLOG_WEIGHTS)


@config_type
class StageConfig:
    """One pipeline's filters -> weighted scorers -> picker (policy.py): a policy's own, or
    the one a role's legs run instead (PipelineConfig.roles)."""

    filters: list[Annotated[Str, OneOf(PIPELINE_FILTER_NAMES, what="filter")]] = Field(
        default_factory=list)
    scorers: dict[ScorerName, Weight] = Field(default_factory=dict)
    picker: Annotated[Str, OneOf(PIPELINE_PICKER_NAMES)] = "max"
    guard: Bool = False  # policy.imbalance: score by queue alone while it trips

    @model_validator(mode="after")
    def _coherent(self) -> StageConfig:
        if len(set(self.filters)) != len(self.filters):
            raise ConfigError("filters: each filter at most once")
        weighted = {k for k, w in self.scorers.items() if w > 0}
        if self.picker == "slo-tiered" and weighted != {"slo"}:
            raise ConfigError("picker: slo-tiered reads the slo scorer's 0.5 line (meets the "
                              "SLO above it), so scorers must be the slo scorer alone")
        unbounded = sorted(weighted - LOAD_AWARE_SCORERS)
        if unbounded and not self.guard and "bounded-load" not in self.filters:
            raise ConfigError(f"filters: scorer {unbounded[0]} has no load term, so it would "
                              "send every request to the endpoint it ranks first: add the "
                              "bounded-load filter or guard: true")
        if not weighted and self.picker not in ("round-robin", "weighted-random"):
            raise ConfigError(f"scorers: picker {self.picker} needs a scorer with a weight "
                              "> 0 (without one every endpoint scores the same)")
        return self


# The legs a pipeline may score with a stage of their own: a P/D pool's prefill and decode
# legs (a unified pool's every leg runs the pipeline itself).
STAGE_ROLES = ("prefill", "decode")
StageRole = Annotated[str, Strict(), OneOf(STAGE_ROLES, what="role")]


@config_type
class PipelineConfig(StageConfig):
    """A policy composed in the config: its stage, and per role of a P/D pool's legs
    (`roles`) the stage those legs run instead, as llm-d's scheduling profiles do."""

    roles: dict[StageRole, StageConfig] = Field(default_factory=dict)


PipelineName = Annotated[str, Strict(), Field(min_length=1, max_length=63,
                                              pattern=PIPELINE_NAME_PATTERN)]


@config_type
class PolicyConfig:
    name: Str = Field(default="cache-aware", min_length=1)  # a preset or a pipelines key
    picker: Annotated[Str, OneOf(PICKER_NAMES)] = "max"
    weights: dict[ScorerName, Weight] = Field(default_factory=_default_weights)
    # cache-aware's weights for the prefill legs of a P/D pool (role prefill); `weights`
    # for every other leg
    prefill_weights: dict[ScorerName, Weight] = Field(default_factory=_default_prefill_weights)
    allow_override: Bool = False
    override_header: Str = Field(default="x-kvfleet-policy", min_length=1)
    imbalance: ImbalanceConfig = Field(default_factory=ImbalanceConfig)
    # The prefix scorer counts a match only where it covers at least this share of the
    # prompt (sgl-router's cache_threshold, 0.3 there): a shared system prompt alone would
    # otherwise pull every new conversation onto the endpoint that first cached it, since
    # the queue term weighs one request at 1/capacity (bench/README.md, "Router prefix
    # affinity"). 0 counts every match.
    min_prefix_match: Float = Field(default=0.1, ge=0, le=1)
    ucb_c: Float = Field(default=1.0, ge=0, le=100)
    # latency / ucb / slo / least-kv choose only among endpoints whose load with this
    # request stays <= ceil(load_factor * fair share) (filters.py, `bounded-load`)
    load_factor: Float = Field(default=1.25, ge=1, le=100)
    ttft_ref_s: Float = Field(default=0.5, gt=0, le=HOUR_S)
    slo: SloConfig = Field(default_factory=SloConfig)
    # Policies composed here, by name, beside the presets (POLICY_NAMES); `name` and the
    # override header may name either.
    pipelines: dict[PipelineName, PipelineConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _some_weight(self) -> PolicyConfig:
        for field_name in ("weights", "prefill_weights"):
            if not any(getattr(self, field_name).values()):
                raise ConfigError(f"{field_name}: at least one weight must be > 0 (all zero "
                                  "ranks every endpoint the same)")
        for key in self.pipelines:
            if key in POLICY_NAMES:
                raise ConfigError(f"pipelines.{key}: is a preset's name; pick another")
        if self.name not in self.policy_names():
            raise ConfigError(f"name: must be one of {', '.join(self.policy_names())}; "
                              f"got {self.name!r}")
        return self

    def policy_names(self) -> tuple[str, ...]:
        """The presets, then the config's pipelines."""
        return (*POLICY_NAMES, *self.pipelines)


@config_type
class SessionConfig:
    header: Str = "x-session-id"
    use_user_field: Bool = True
    # bounded-load hashing: cap = factor * mean load
    load_factor: Float = Field(default=1.25, ge=1, le=100)


@config_type
class TokenizerConfig:
    # A folder with the pool model's tokenizer.json (and tokenizer_config.json: chat
    # template, BOS): text prompts are then tokenized as the engine will, so they can use
    # the precise index of `prefix_mode: precise` endpoints (text_tokens.py). "" = off.
    path: Str = ""
    # Chat requests too (the model's chat template); false: only completions prompts.
    chat: Bool = True
    # Prompts of more characters are tokenized on a thread, off the event loop (about
    # 0.3 us per character; router README, "Text prompts on the precise index").
    offload_chars: Int = Field(default=4096, ge=0, le=1 << 30)


@config_type
class PrefixConfig:
    block_bytes: Int = Field(default=64, ge=1, le=1 << 20)
    # The approximate index must remember at least what an engine's KV cache holds: a
    # prefix it forgot first is placed anew by load, so a conversation the engine still
    # caches spreads over backends (bench/README.md, "Router prefix affinity"). 65536 x 64 B
    # is 4 MiB of prompt text, about 1M tokens (one large GPU's cache), ~13 MB of index.
    max_blocks_per_endpoint: Int = Field(default=65536, ge=1, le=10_000_000)
    # prompt tokens from text, no tokenizer
    chars_per_token: Float = Field(default=4.0, ge=0.1, le=64)
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)


@config_type
class SaturationConfig:
    # engine-reported waiting requests; 0 disables
    max_waiting: Int = Field(default=0, ge=0, le=1_000_000)
    max_kv_usage: Float = Field(default=0.98, gt=0, le=1)


@config_type
class QueueConfig:
    max_size: Int = Field(default=256, ge=0, le=100_000)
    timeout_s: Float = Field(default=5.0, ge=0, le=HOUR_S)
    retry_after_s: Int = Field(default=1, ge=0, le=HOUR_S)


# --- flow_control: tenants, priority bands, fair shares (flow/ reads it) ---

# Named priority bands and their integers: lower is served first, as with vLLM's and the
# engine's `priority`. A tenant's band is one of these names or any integer in BAND_RANGE.
BAND_VALUES = {"critical": -1, "standard": 0, "sheddable": 1}
BAND_RANGE = (-100, 100)
TENANT_NAME_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.:@]{0,126}[A-Za-z0-9])?$"


def band_value(band: str | int) -> int:
    """A band (a name of BAND_VALUES or an integer) as its integer; lower goes first."""
    return BAND_VALUES[band] if isinstance(band, str) else band


def _check_band(band: str | int) -> str | int:
    if isinstance(band, str):
        if band not in BAND_VALUES:
            raise PydanticCustomError("band", "must be one of {names} or an integer in "
                                      "[{low}, {high}]; got {value!r}",
                                      {"names": ", ".join(BAND_VALUES), "low": BAND_RANGE[0],
                                       "high": BAND_RANGE[1], "value!r": repr(band)})
    elif not BAND_RANGE[0] <= band <= BAND_RANGE[1]:
        raise PydanticCustomError("band", "an integer band must be in [{low}, {high}]; got "
                                  "{value}", {"low": BAND_RANGE[0], "high": BAND_RANGE[1],
                                              "value": band})
    return band


@config_type
class TenantConfig:
    band: Str | Int = "standard"
    weight: Float = Field(default=1.0, gt=0, le=MAX_WEIGHT)  # share inside its band

    @field_validator("band")
    @classmethod
    def _band(cls, band: str | int) -> str | int:
        return _check_band(band)


TenantName = Annotated[str, Strict(), Field(min_length=1, max_length=128,
                                            pattern=TENANT_NAME_PATTERN)]


@config_type
class FlowControlConfig:
    """Who is asking and who goes first when every endpoint is busy (flow/). The queue's
    total bound, its TTL and Retry-After stay in `queue`; bands may be bounded further."""

    tenant_header: Str = Field(default="x-kvfleet-tenant", min_length=1)
    default_tenant: TenantName = "default"  # requests without the header
    # Unconfigured tenants: the default band, weight 1 each.
    default_band: Str | Int = "standard"
    tenants: dict[TenantName, TenantConfig] = Field(default_factory=dict)
    # band (a name, or an integer written as a string) -> queued requests it may hold
    max_queued_per_band: dict[Str, Annotated[Int, Field(ge=0, le=100_000)]] = Field(
        default_factory=dict)
    # attained service (input + output tokens) decays with this time constant
    service_window_s: Float = Field(default=60.0, ge=1, le=24 * HOUR_S)
    # tenants with their own metric label (configured ones always); the rest are `other`
    max_tenant_labels: Int = Field(default=20, ge=0, le=10_000)
    # tenants whose attained service the fair queue and the seats keep (tenant ids come
    # from a header, so clients can name a new one per request); past it the least served
    # are forgotten (flow/service.py)
    max_tracked_tenants: Int = Field(default=10_000, ge=16, le=10_000_000)
    # send the effective band as the body's `priority` (kvfleet engines order and preempt
    # by it); vLLM refuses a priority unless started with --scheduling-policy priority
    forward_priority: Bool = True
    forward_priority_to_vllm: Bool = False

    @field_validator("default_band")
    @classmethod
    def _default_band(cls, band: str | int) -> str | int:
        return _check_band(band)

    @model_validator(mode="after")
    def _band_bounds(self) -> FlowControlConfig:
        for key in self.max_queued_per_band:
            try:
                _check_band(int(key) if key.lstrip("-").isdigit() else key)
            except PydanticCustomError as exc:
                raise ConfigError(f"max_queued_per_band.{key}: {exc.message()}") from None
        return self

    def band_bound(self, band: int) -> int | None:
        """The bound of the band with integer `band`, or None (the total bound only)."""
        for key, bound in self.max_queued_per_band.items():
            if band_value(int(key) if key.lstrip("-").isdigit() else key) == band:
                return bound
        return None


def _at_least(obj: _C, high: str, low: str) -> _C:
    """A cross-field rule: field `high` is not below field `low`."""
    hi, lo = getattr(obj, high), getattr(obj, low)
    if hi < lo:
        raise ConfigError(f"{high}: must be >= {low} ({hi:g} < {lo:g})")
    return obj


@config_type
class HealthConfig:
    probe_interval_s: Float = Field(default=2.0, ge=0.1, le=HOUR_S)
    probe_timeout_s: Float = Field(default=1.0, ge=0.01, le=600)
    eject_after_errors: Int = Field(default=3, ge=1, le=1000)
    eject_base_s: Float = Field(default=2.0, ge=0.01, le=HOUR_S)
    eject_max_s: Float = Field(default=30.0, ge=0.01, le=24 * HOUR_S)

    @model_validator(mode="after")
    def _max_over_base(self) -> HealthConfig:
        return _at_least(self, "eject_max_s", "eject_base_s")


@config_type
class SignalsConfig:
    poll_interval_s: Float = Field(default=1.0, ge=0.1, le=HOUR_S)
    stale_after_s: Float = Field(default=5.0, ge=0.1, le=24 * HOUR_S)

    @model_validator(mode="after")
    def _stale_over_poll(self) -> SignalsConfig:
        return _at_least(self, "stale_after_s", "poll_interval_s")


@config_type
class TimeoutsConfig:
    # a refused connect fails at once; this bounds SYN retries
    connect_s: Float = Field(default=10.0, ge=0.01, le=600)
    first_byte_s: Float = Field(default=60.0, ge=0.01, le=HOUR_S)
    idle_s: Float = Field(default=60.0, ge=0.01, le=HOUR_S)


@config_type
class RetriesConfig:
    max_attempts: Int = Field(default=2, ge=1, le=10)


@config_type
class MigrationConfig:
    """Request migration (migration.py): a stream broken after its first byte (the
    engine died, hung past `timeouts.idle_s`, or the connection was cut) continues on
    another endpoint with what was already generated, as one stream to the client."""

    enabled: Bool = True
    max_migrations: Int = Field(default=2, ge=1, le=10)
    token_ids: Bool = True


@config_type
class PDConfig:
    # Read at each check: a decider plugin registers its name in PD_DECIDER_NAMES.
    decider: Annotated[Str, OneOf(lambda: PD_DECIDER_NAMES)] = "uncached-tokens"
    prefill_threshold_tokens: Int = Field(default=128, ge=0, le=10_000_000)


@config_type
class KVSharingConfig:
    """Peer prefix hints: when to let an endpoint fetch a prompt's cached prefix from the
    peer that holds it instead of recomputing it (`peer_hint.decide_peer_hint`). The
    prefill-rate prior is `policy.slo.prefill_s_per_token`, the SLO scorer's."""

    enabled: Bool = False
    margin: Float = Field(default=1.5, ge=1, le=100)
    min_gain_blocks: Int = Field(default=2, ge=1, le=1_000_000)
    bandwidth_bytes_per_s: Float = Field(default=1e9, gt=0, le=1e13)
    latency_s: Float = Field(default=0.002, ge=0, le=60)
    kv_bytes_per_token: Float = Field(default=131072.0, gt=0, le=1 << 30)


@config_type
class LimitsConfig:
    max_body_bytes: Int = Field(default=4 * 1024 * 1024, ge=1, le=MAX_BODY_BYTES_CEILING)
    body_read_timeout_s: Float = Field(default=DEFAULT_BODY_READ_TIMEOUT_S, ge=0.1, le=HOUR_S)
    max_uploads_per_client: Int = Field(default=DEFAULT_MAX_UPLOADS_PER_CLIENT, ge=1,
                                        le=100_000)


PeerUrl = Annotated[str, Strict(), Field(pattern=r"^https?://[^/\s]+$", max_length=256)]


@config_type
class ExchangeConfig:
    """State shared among a pool's router replicas (exchange.py): the approximate index's
    recorded prefixes, in-flight counts per endpoint and session placements, pushed to every
    peer each `interval_s`, so that replicas behind one Service route as one router would.
    Eventually consistent: a push that fails is dropped, never retried, and nothing waits
    for a peer (under a partition each side routes on what it has)."""

    enabled: Bool = False
    peers: list[PeerUrl] = Field(default_factory=list, max_length=256)  # http://host:port
    # "host:port": each address `host` resolves to is a peer (a headless Service's pods)
    peers_dns: Annotated[str, Strict(), Field(pattern=r"^$|^[A-Za-z0-9.\-]+:[0-9]{1,5}$",
                                              max_length=256)] = ""
    refresh_s: Float = Field(default=5.0, ge=0.1, le=HOUR_S)
    interval_s: Float = Field(default=0.1, ge=0.01, le=60)
    max_batch_blocks: Int = Field(default=65536, ge=1, le=10_000_000)
    stale_after_s: Float = Field(default=2.0, ge=0.05, le=HOUR_S)
    timeout_s: Float = Field(default=0.5, ge=0.01, le=60)
    warm: Bool = True

    @model_validator(mode="after")
    def _stale_over_interval(self) -> ExchangeConfig:
        return _at_least(self, "stale_after_s", "interval_s")


RevisionName = Annotated[str, Strict(), Field(pattern=REVISION_PATTERN)]


@config_type
class RevisionsConfig:
    """The traffic split of a rollout (revisions.py): each new request is assigned one
    revision in proportion to `weights`, then routed among that revision's endpoints."""

    weights: dict[RevisionName, Annotated[Int, Field(ge=0, le=100)]] = Field(
        default_factory=dict)

    @model_validator(mode="after")
    def _some_weight(self) -> RevisionsConfig:
        if not any(self.weights.values()):
            raise ConfigError("weights: at least one revision must have a weight > 0 (else no "
                              "request could be placed); leave `revisions` out for no split")
        return self


# --- quotas: per-tenant requests and tokens per minute (quota.py reads it) ---

QuotaTenant = Annotated[str, Strict(), Field(min_length=1, max_length=128)]


@config_type
class TenantQuota:
    """One tenant's limits; 0 means no limit."""

    rpm: Int = Field(default=0, ge=0, le=1_000_000_000)  # requests per minute
    tpm: Int = Field(default=0, ge=0, le=1_000_000_000_000)  # tokens per minute


@config_type
class QuotasConfig:
    """Token buckets per tenant (quota.py), answered as OpenAI does (429 and
    `x-ratelimit-*` headers). Off by default: `default` has no limits."""

    default: TenantQuota = Field(default_factory=TenantQuota)  # tenants not listed
    tenants: dict[QuotaTenant, TenantQuota] = Field(default_factory=dict)
    # A bucket holds this many seconds of its limit (at least one request): any 60 s window
    # admits at most limit x (1 + burst_s / 60) plus one request's overshoot.
    burst_s: Float = Field(default=2.0, ge=0.01, le=60)
    # tokens charged for the answer when a request sets no max_tokens (settled on usage)
    default_max_tokens: Int = Field(default=256, ge=1, le=10_000_000)
    # tenants with a bucket; past it full buckets go, then the fullest (quota.py)
    max_tracked_tenants: Int = Field(default=10_000, ge=16, le=10_000_000)

    @property
    def is_enabled(self) -> bool:
        return any(q.rpm or q.tpm for q in (self.default, *self.tenants.values()))


@config_type
class RouterConfig:
    version: Int = Field(default=0, ge=0, le=2**63 - 1)
    endpoints: list[EndpointConfig] = Field(default_factory=list)
    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    session: SessionConfig = Field(default_factory=SessionConfig)
    prefix: PrefixConfig = Field(default_factory=PrefixConfig)
    saturation: SaturationConfig = Field(default_factory=SaturationConfig)
    queue: QueueConfig = Field(default_factory=QueueConfig)
    health: HealthConfig = Field(default_factory=HealthConfig)
    signals: SignalsConfig = Field(default_factory=SignalsConfig)
    timeouts: TimeoutsConfig = Field(default_factory=TimeoutsConfig)
    retries: RetriesConfig = Field(default_factory=RetriesConfig)
    migration: MigrationConfig = Field(default_factory=MigrationConfig)
    pd: PDConfig = Field(default_factory=PDConfig)
    quotas: QuotasConfig = Field(default_factory=QuotasConfig)
    kv_sharing: KVSharingConfig = Field(default_factory=KVSharingConfig)
    limits: LimitsConfig = Field(default_factory=LimitsConfig)
    flow_control: FlowControlConfig = Field(default_factory=FlowControlConfig)
    exchange: ExchangeConfig = Field(default_factory=ExchangeConfig)
    revisions: RevisionsConfig | None = None  # None: no split (every endpoint as ever)
    schema: Annotated[Str, OneOf((SCHEMA,))] = SCHEMA

    @model_validator(mode="after")
    def _unique_names(self) -> RouterConfig:
        seen: set[str] = set()
        for i, ep in enumerate(self.endpoints):
            if ep.name in seen:
                raise ConfigError(f"endpoints[{i}].name: duplicate name {ep.name!r}")
            seen.add(ep.name)
        return self

    @classmethod
    def from_dict(cls, data: Any) -> RouterConfig:
        try:
            return _adapter().validate_python(data)
        except ValidationError as exc:
            raise config_error(exc, cls) from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @staticmethod
    def json_schema() -> dict[str, Any]:
        """The document's JSON Schema, derived from the same declarations that validate it."""
        return _adapter().json_schema()


@functools.cache
def _adapter() -> TypeAdapter[RouterConfig]:
    return TypeAdapter(RouterConfig)


# --- pydantic's errors as ConfigError: the field's path, then what it accepts ---


def config_error(exc: ValidationError, root: type) -> ConfigError:
    """The first problem pydantic found, as `path: must be ..., got ...`."""
    error = exc.errors()[0]
    loc = error["loc"]
    if loc[-1:] == ("[key]",) and not isinstance(loc[-2], str):
        return ConfigError(f"{_path(loc[:-2])}: keys must be strings, got "
                           f"{_type_name(loc[-2])}")
    path = _path(loc)
    inner = (error.get("ctx") or {}).get("error")
    if isinstance(inner, ConfigError):  # a cross-field rule, with a path below the object
        return ConfigError(f"{path}.{inner}" if path else str(inner))
    return ConfigError(f"{path or '<root>'}: {_message(error, root)}")


def _path(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if part == "[key]":
            continue
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _message(error: Any, root: type) -> str:
    kind, ctx, value = error["type"], error.get("ctx") or {}, error.get("input")
    if kind == "missing":
        return "required"
    if kind == "unexpected_keyword_argument":
        return "unknown field"
    if kind == "enum":
        if error["loc"][-1:] == ("[key]",):
            return f"unknown {ctx['what']}; known: {ctx['allowed']}"
        return f"must be one of {ctx['allowed']}; got {value!r}"
    if kind == "string_too_short":
        return "must not be empty"
    if kind == "string_pattern_mismatch":
        subject = "the name " if error["loc"][-1:] == ("[key]",) else ""  # a key: in the path
        return f"{subject}must match {ctx['pattern']}"
    annotation, bounds = field_type(root, error["loc"])
    if annotation in (int, float):
        what = "an integer" if annotation is int else "a finite number"
        return f"must be {what}{bounds_text(bounds)}, got {shown(value, _type_name)}"
    expected = {"bool_type": "a boolean", "string_type": "a string", "list_type": "a list",
                "dict_type": "a mapping", "dataclass_type": "a mapping"}
    if kind in expected:
        return f"must be {expected[kind]}, got {_type_name(value)}"
    return str(error["msg"])  # pydantic's own words (a type this module has not met)


def field_type(
    root: Any, loc: tuple[int | str, ...], alias: Any = None
) -> tuple[Any, list[Any]]:
    """The type `loc` ends at (without Optional and Annotated) and its constraints.
    `alias(name)` is a field's key in the document where it differs from the Python name
    (the InferencePool's camelCase keys); one implementation serves both configs."""
    annotation, meta = _unwrap(root, [])
    for part in loc:
        if part == "[key]":
            return str, []
        fields = getattr(annotation, "__pydantic_fields__", None)
        info = None if fields is None else fields.get(part) or next(
            (f for name, f in fields.items() if alias is not None and alias(name) == part), None)
        if info is not None:
            annotation, meta = _unwrap(info.annotation, list(info.metadata))
        elif fields is None and get_origin(annotation) in (list, dict):
            annotation, meta = _unwrap(get_args(annotation)[-1], [])
        else:
            return None, []
    return annotation, meta


def _unwrap(annotation: Any, meta: list[Any]) -> tuple[Any, list[Any]]:
    while True:
        if get_origin(annotation) is Annotated:
            for item in annotation.__metadata__:
                meta = [*meta, *(item.metadata if isinstance(item, FieldInfo) else [item])]
            annotation = get_args(annotation)[0]
        elif get_origin(annotation) in (Union, UnionType):
            annotation = next(a for a in get_args(annotation) if a is not NoneType)
        else:
            return annotation, meta


def bounds_text(meta: list[Any]) -> str:
    """A field's numeric constraints as text: ` in [1, 256]`, ` in (0, 1]`, ` >= 1`, or ''."""
    low = next((m for m in meta if isinstance(m, at.Ge | at.Gt)), None)
    high = next((m.le for m in meta if isinstance(m, at.Le)), None)
    if low is None and high is None:
        return ""
    is_open = isinstance(low, at.Gt)
    low_value = low.gt if isinstance(low, at.Gt) else getattr(low, "ge", None)
    if high is None:
        return f" {'>' if is_open else '>='} {_num(low_value)}"
    if low is None:
        return f" <= {_num(high)}"
    return f" in {'(' if is_open else '['}{_num(low_value)}, {_num(high)}]"


def _num(value: Any) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def shown(value: Any, type_name: Any) -> str:
    """A bad value as a message shows it: numbers as written, anything else by its type."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(type_name(value))
    if isinstance(value, int) and abs(value) > 1e300:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value) if isinstance(value, int) or not math.isfinite(value) else f"{value:g}"


def _type_name(value: Any) -> str:
    names = {dict: "mapping", list: "list", str: "string", bool: "boolean", int: "integer",
             float: "number", NoneType: "null"}
    return names.get(type(value), type(value).__name__)


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
