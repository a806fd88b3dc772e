"""InferencePool spec types (kvfleet.io/v1alpha1). Mirrors crds/inferencepools.kvfleet.io.yaml.

Each type is a pydantic dataclass (`@spec_type`, see validation.py): field rules sit on the
fields (`Field(...)`, `OneOf(...)`, `Quantity`); cross-field rules (the CRD's CEL rules) are
`model_validator(mode="after")` methods that raise SpecError with the path relative to the
object.
"""

from __future__ import annotations

import dataclasses
from dataclasses import KW_ONLY
from typing import Annotated

from kvfleet_engine import contract
from kvfleet_router.config import (
    PIPELINE_FILTER_NAMES,
    PIPELINE_PICKER_NAMES,
    PREFIX_MODES,
    ConfigError,
    OneOf,
    PipelineConfig,
    PolicyConfig,
)
from pydantic import Field, model_validator

from .errors import SpecError, UnservableSpecError
from .flow_control import FlowControlSpec
from .validation import Bool, Float, Int, Quantity, Str, spec_type
from .vllm_compat import check_vllm_engine

ENGINE_KINDS = ("vllm", "builtin")
RUNNERS = ("torch", "simulated")
PIPELINE_POLICY = "pipeline"  # routing.policy that runs the pool's own routing.pipeline
ROUTING_POLICIES = (
    "cache-aware", "prefix-cache", "least-kv", "least-request", "round-robin",
    "random", "session", "latency", "ucb", "slo", "backlog", PIPELINE_POLICY,
)
ROLES = ("unified", "prefill", "decode")
ROUTER_PLACEMENTS = ("deployment", "sidecar")
GATEWAY_KINDS = ("gie",)
GATEWAY_FAILURE_MODES = ("FailClose", "FailOpen")  # GIE endpointPickerRef.failureMode
BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SOURCE_SCHEMES = ("builtin", "hf", "pvc", "s3", "gs", "file")
SOURCE_PATTERN = r"^(builtin|hf|pvc|s3|gs)://[^\s]+$|^file:///[^\s]*$"
SOURCE_HELP = "builtin://NAME, hf://ORG/REPO, pvc://CLAIM/PATH, s3://BUCKET/KEY, gs://... or file:///PATH"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
HEADER_PATTERN = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"
GPU_RESOURCE = "nvidia.com/gpu"
MIN_KV_TOKENS = 256  # the least KV room a pool without maxModelLen may leave (one short turn)


@spec_type
class ModelSpec:
    name: Annotated[Str, Field(min_length=1, max_length=256)]
    source: Str | None = Field(default=None, pattern=SOURCE_PATTERN, max_length=1024)
    served_model_name: Str | None = Field(default=None, min_length=1, max_length=256)

    @model_validator(mode="after")
    def _has_source(self) -> ModelSpec:
        if not self.source:
            raise SpecError("source", f"a model source is required ({SOURCE_HELP})")
        return self

    @property
    def scheme(self) -> str:
        return (self.source or "").split("://", 1)[0]

    @property
    def api_name(self) -> str:
        """The model name clients send in requests."""
        return self.served_model_name or self.name


@spec_type
class EngineSpec:
    kind: Annotated[Str, OneOf(ENGINE_KINDS)] = "vllm"
    image: Str | None = Field(default=None, min_length=1, max_length=512)
    args: list[Annotated[Str, Field(max_length=1024)]] = Field(default_factory=list,
                                                                 max_length=64)
    runner: Annotated[Str, OneOf(RUNNERS)] = "torch"
    profile: Str | None = Field(default=None, pattern=NAME_PATTERN, max_length=63)
    max_num_seqs: Int = Field(default=256, ge=1, le=65536)
    max_num_batched_tokens: Int = Field(default=8192, ge=1, le=1048576)
    max_model_len: Int | None = Field(default=None, ge=16, le=1048576)
    block_size: Int = Field(default=16, ge=1, le=256)
    enable_prefix_caching: Bool = True
    gpu_memory_utilization: Float = Field(default=0.9, gt=0, le=1)
    num_blocks: Int | None = Field(default=None, ge=2, le=16777216)

    @model_validator(mode="after")
    def _consistent(self) -> EngineSpec:
        if self.block_size not in BLOCK_SIZES:
            raise SpecError("blockSize", f"must be a power of two (1..256), got {self.block_size}")
        if self.runner == "simulated" and self.kind != "builtin":
            raise SpecError("runner", "the simulated runner needs kind: builtin")
        if self.runner == "simulated" and not self.profile:
            raise SpecError("profile", "a timing profile is required with runner: simulated")
        if self.max_num_batched_tokens < self.max_num_seqs:
            raise SpecError(
                "maxNumBatchedTokens",
                f"must be >= maxNumSeqs ({self.max_num_batched_tokens} < {self.max_num_seqs})",
            )
        owned = [a for a in self.args if a.split("=", 1)[0] in contract.OWNED_ENGINE_FLAGS]
        if owned:
            flag = owned[0].split("=", 1)[0]
            raise SpecError("args", f"must not set {flag}: the operator sets the engine's address")
        if self.num_blocks is not None:
            usable = (self.num_blocks - 1) * self.block_size
            need = self.max_model_len or MIN_KV_TOKENS
            what = "maxModelLen" if self.max_model_len else "the minimum without maxModelLen"
            if usable < need:
                raise SpecError(
                    "numBlocks",
                    f"{self.num_blocks} blocks of {self.block_size} tokens hold {usable} tokens "
                    f"(block 0 is reserved), less than one max-length sequence ({need}: {what})",
                )
        if self.runner == "simulated" and self.profile not in contract.BUILTIN_PROFILES:
            known = ", ".join(contract.BUILTIN_PROFILES)
            raise UnservableSpecError("profile",
                                      f"unknown profile {self.profile!r}; known: {known}")
        return self

    @property
    def is_builtin(self) -> bool:
        return self.kind == "builtin"


@spec_type
class ReplicasSpec:
    min: Int = Field(default=1, ge=0, le=1000)
    max: Int = Field(default=1, ge=0, le=1000)

    @model_validator(mode="after")
    def _min_within_max(self) -> ReplicasSpec:
        if self.max < 1:
            raise SpecError("max", f"must be >= 1, got {self.max}")
        if self.min > self.max:
            raise SpecError("min", f"must be <= max ({self.min} > {self.max})")
        return self


@spec_type
class ResourcesSpec:
    requests: dict[Str, Quantity] | None = Field(default=None, max_length=16)
    limits: dict[Str, Quantity] | None = Field(default=None, max_length=16)


@spec_type
class Toleration:
    key: Str | None = Field(default=None, max_length=253)
    operator: Annotated[Str, OneOf(("Equal", "Exists"))] = "Equal"
    value: Str | None = Field(default=None, max_length=63)
    effect: Annotated[Str, OneOf(("NoSchedule", "PreferNoSchedule", "NoExecute"))] | None = None
    toleration_seconds: Int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _consistent(self) -> Toleration:
        if self.operator == "Exists" and self.value is not None:
            raise SpecError("value", "must be empty when operator is Exists")
        if self.operator == "Equal" and self.key is None:
            raise SpecError("key", "is required when operator is Equal")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise SpecError("tolerationSeconds", "only applies with effect NoExecute")
        return self


@spec_type
class RoleSpec:
    replicas: ReplicasSpec = Field(default_factory=ReplicasSpec)
    gpus: Int = Field(default=0, ge=0, le=16)
    resources: ResourcesSpec | None = None
    node_selector: dict[Str, Annotated[Str, Field(max_length=63)]] | None = Field(
        default=None, max_length=32)
    tolerations: list[Toleration] | None = Field(default=None, max_length=32)

    @model_validator(mode="after")
    def _one_gpu_setting(self) -> RoleSpec:
        limits = (self.resources.limits if self.resources else None) or {}
        if self.gpus > 0 and GPU_RESOURCE in limits:
            raise SpecError(
                "gpus", f"set gpus or resources.limits[{GPU_RESOURCE}], not both"
            )
        return self


@spec_type
class TopologySpec:
    unified: RoleSpec | None = None
    prefill: RoleSpec | None = None
    decode: RoleSpec | None = None

    @model_validator(mode="after")
    def _one_mode(self) -> TopologySpec:
        split = self.prefill is not None or self.decode is not None
        if self.unified is not None and split:
            raise SpecError("unified", "cannot be combined with prefill/decode; choose one mode")
        if self.unified is None and not split:
            raise SpecError("", "set either unified, or both prefill and decode")
        if split and (self.prefill is None or self.decode is None):
            missing = "decode" if self.decode is None else "prefill"
            raise SpecError(missing, "is required: prefill and decode come as a pair")
        return self

    @property
    def is_disaggregated(self) -> bool:
        return self.unified is None

    @property
    def mode(self) -> str:
        return "disaggregated" if self.is_disaggregated else "unified"

    def roles(self) -> dict[str, RoleSpec]:
        """The roles this topology runs, in a stable order (unified, or prefill then decode)."""
        pairs = (("unified", self.unified), ("prefill", self.prefill), ("decode", self.decode))
        return {name: role for name, role in pairs if role is not None}


Weight = Annotated[Float, Field(ge=0, le=100)]


@spec_type
class WeightsSpec:
    """Scorer weights for cache-aware routing; unset ones keep the router's default."""

    prefix: Weight | None = None
    queue: Weight | None = None
    pending: Weight | None = None
    backlog: Weight | None = None
    kv: Weight | None = None
    session: Weight | None = None
    latency: Weight | None = None
    ucb: Weight | None = None
    slo: Weight | None = None
    space: Weight | None = None


@spec_type
class StageSpec:
    """One stage of a pipeline: the optional filters, the scorers' weights, the picker and
    the guard (the router's config.StageConfig)."""

    filters: list[Annotated[Str, OneOf(PIPELINE_FILTER_NAMES)]] = Field(default_factory=list,
                                                                         max_length=8)
    scorers: WeightsSpec = Field(default_factory=lambda: WeightsSpec())  # unset: not used
    picker: Annotated[Str, OneOf(PIPELINE_PICKER_NAMES)] = "max"
    guard: Bool = False

    def router_stage(self) -> dict[str, object]:
        """The router config's form: scorers without the unset ones."""
        scorers = {f.name: float(v) for f in dataclasses.fields(self.scorers)
                   if (v := getattr(self.scorers, f.name)) is not None}
        return {"filters": list(self.filters), "scorers": scorers, "picker": self.picker,
                "guard": self.guard}


@spec_type
class PipelineRolesSpec:
    """The stage a P/D pool's prefill or decode legs run instead of the pipeline's own."""

    prefill: StageSpec | None = None
    decode: StageSpec | None = None


@spec_type
class PipelineSpec(StageSpec):
    """A routing policy composed in the pool (`routing.policy: pipeline`): the router's
    `policy.pipelines` entry, under the same rules (router/kvfleet_router/config.py)."""

    roles: PipelineRolesSpec = Field(default_factory=lambda: PipelineRolesSpec())

    def router_pipeline(self) -> dict[str, object]:
        roles = {f.name: stage.router_stage() for f in dataclasses.fields(self.roles)
                 if (stage := getattr(self.roles, f.name)) is not None}
        return {**self.router_stage(), "roles": roles}

    @model_validator(mode="after")
    def _router_rules(self) -> PipelineSpec:
        try:
            PipelineConfig(**self.router_pipeline())  # type: ignore[arg-type]
        except ConfigError as exc:  # "field: why", the field as the spec spells it
            field, _, why = str(exc).partition(": ")
            raise UnservableSpecError(field, why) from None
        return self


@spec_type
class ImbalanceSpec:
    abs_threshold: Int = Field(default=8, ge=0, le=100000)
    rel_threshold: Float = Field(default=1.5, ge=1, le=100)


@spec_type
class GatewaySpec:
    """Serve the pool behind a Gateway API Inference Extension gateway: the operator adds a
    GIE `inference.networking.k8s.io/v1` InferencePool over the engine pods and kvfleet's
    endpoint picker (`kvfleet router --epp-port`) as its Deployment and Service."""

    kind: Annotated[Str, OneOf(GATEWAY_KINDS)] = "gie"
    failure_mode: Annotated[Str, OneOf(GATEWAY_FAILURE_MODES)] = "FailClose"


@spec_type
class KVSharingSpec:
    """Fleet-wide KV: builtin engines fetch a prompt's cached prefix from the peer that
    holds it when the router estimates that beats recomputing it (by `margin`); vLLM
    engines share KV through an LMCache server (Kubernetes only). Off by default until
    measured to help."""

    enabled: Bool = False
    margin: Float = Field(default=1.5, ge=1, le=100)


@spec_type
class MigrationSpec:
    """Request migration: a stream whose replica dies, hangs or is cut off after the first
    byte continues on another replica, with what was already generated, as one stream to
    the client (token-exact where the engines return token ids: builtin, vLLM >= 0.10.2)."""

    enabled: Bool = True
    max_migrations: Int = Field(default=2, ge=1, le=10)


@spec_type
class RoutingSpec:
    policy: Annotated[Str, OneOf(ROUTING_POLICIES)] = "cache-aware"
    weights: WeightsSpec | None = None
    prefill_weights: WeightsSpec | None = None  # cache-aware's on P/D prefill legs
    imbalance: ImbalanceSpec = Field(default_factory=ImbalanceSpec)
    # the router's policy.min_prefix_match: a prefix match under this share of the prompt
    # scores 0 (a shared system prompt alone does not pull a request to one replica)
    min_prefix_match: Float = Field(default=0.1, ge=0, le=1)
    session_header: Str = Field(default="x-session-id", pattern=HEADER_PATTERN, max_length=128)
    replicas: Int = Field(default=1, ge=1, le=32)
    # `kvfleet router --workers N` per router pod; unset: one per whole core of the router's
    # CPU request, 1..8 (decide/router_process.py).
    workers: Int | None = Field(default=None, ge=1, le=64)
    resources: ResourcesSpec | None = None  # the router container's; unset: 500m, 512Mi
    pd_threshold_tokens: Int = Field(default=128, ge=0, le=1048576)
    placement: Annotated[Str, OneOf(ROUTER_PLACEMENTS)] = "deployment"
    prefix_mode: Annotated[Str, OneOf(PREFIX_MODES)] = "approximate"
    # the model's tokenizer folder as the router sees it: text prompts on the precise index
    # too (router prefix.tokenizer; off by default, bench/text_precise_cost.py)
    text_tokenizer_path: Str = Field(default="", max_length=1024, pattern=r"^$|^/")
    gateway: GatewaySpec | None = None
    kv_sharing: KVSharingSpec = Field(default_factory=KVSharingSpec)
    migration: MigrationSpec = Field(default_factory=MigrationSpec)
    pipeline: PipelineSpec | None = None
    flow_control: FlowControlSpec | None = None  # unset: the router's defaults (flow_control.py)

    @model_validator(mode="after")
    def _tokenizer_with_precise(self) -> RoutingSpec:
        # The CRD's CEL rule on the spec says the same.
        if self.text_tokenizer_path and self.prefix_mode != "precise":
            raise SpecError("textTokenizerPath", "needs routing.prefixMode: precise (only the "
                                                 "precise index uses token ids)")
        return self

    @model_validator(mode="after")
    def _pipeline_with_its_policy(self) -> RoutingSpec:
        # The CRD's CEL rule on routing says the same.
        if self.policy == PIPELINE_POLICY and self.pipeline is None:
            raise SpecError("pipeline", "is required by policy: pipeline")
        if self.policy != PIPELINE_POLICY and self.pipeline is not None:
            raise SpecError("pipeline", f"runs only with policy: pipeline (policy is "
                                        f"{self.policy})")
        return self

    @model_validator(mode="after")
    def _some_weight(self) -> RoutingSpec:
        for name, merged in (("weights", self.effective_weights()),
                             ("prefillWeights", self.effective_prefill_weights())):
            if merged is not None and not any(merged.values()):
                raise UnservableSpecError(
                    name, "are all zero, so no scorer would count; leave them unset for the "
                    "router's defaults")
        return self

    def effective_weights(self) -> dict[str, float] | None:
        """The spec's weights over the router's defaults (the router replaces the whole map),
        or None to keep the router's defaults."""
        return _over_defaults(self.weights, PolicyConfig().weights)

    def effective_prefill_weights(self) -> dict[str, float] | None:
        """`effective_weights` for the prefill legs (router policy.prefill_weights)."""
        return _over_defaults(self.prefill_weights, PolicyConfig().prefill_weights)


def _over_defaults(spec: WeightsSpec | None, defaults: dict[str, float]
                   ) -> dict[str, float] | None:
    """`defaults` with the weights `spec` sets, sorted; None when `spec` is unset."""
    if spec is None:
        return None
    merged = dict(defaults)
    for f in dataclasses.fields(spec):
        value = getattr(spec, f.name)
        if value is not None:
            merged[f.name] = float(value)
    return dict(sorted(merged.items()))


@spec_type
class TargetsSpec:
    """Autoscaling targets, each in (0, max]; the CRD checks these ranges with CEL rules."""

    waiting_per_replica: Float = Field(default=2.0, gt=0, le=10000)
    kv_cache_usage: Float = Field(default=0.8, gt=0, le=1)
    running_per_replica: Float | None = Field(default=None, gt=0, le=100000)
    ttft_p90_seconds: Float | None = Field(default=None, gt=0, le=600)
    itl_p90_seconds: Float | None = Field(default=None, gt=0, le=60)
    prefill_tokens_per_second_per_replica: Float | None = Field(default=None, gt=0,
                                                                 le=10000000)


@spec_type
class ScaleUpSpec:
    stabilization_window_seconds: Int = Field(default=0, ge=0, le=3600)
    max_step: Int = Field(default=4, ge=1, le=1000)
    cooldown_seconds: Int = Field(default=15, ge=0, le=3600)


@spec_type
class ScaleDownSpec:
    stabilization_window_seconds: Int = Field(default=300, ge=0, le=3600)
    max_step: Int = Field(default=4, ge=1, le=1000)
    cooldown_seconds: Int = Field(default=60, ge=0, le=3600)


@spec_type
class PanicSpec:
    window_seconds: Int = Field(default=6, ge=1, le=600)
    threshold: Float = Field(default=2.0, ge=1, le=100)


@spec_type
class ScaleToZeroSpec:
    enabled: Bool = False
    idle_seconds: Int = Field(default=300, ge=1, le=86400)


@spec_type
class AutoscalingSpec:
    enabled: Bool = True
    interval_seconds: Int = Field(default=10, ge=1, le=3600)
    window_seconds: Int = Field(default=60, ge=1, le=3600)
    targets: TargetsSpec = Field(default_factory=TargetsSpec)
    scale_up: ScaleUpSpec = Field(default_factory=ScaleUpSpec)
    scale_down: ScaleDownSpec = Field(default_factory=ScaleDownSpec)
    panic: PanicSpec = Field(default_factory=PanicSpec)
    drain_timeout_seconds: Int = Field(default=120, ge=0, le=86400)
    scale_to_zero: ScaleToZeroSpec = Field(default_factory=ScaleToZeroSpec)

    @model_validator(mode="after")
    def _consistent(self) -> AutoscalingSpec:
        if self.panic.window_seconds > self.window_seconds:
            raise SpecError(
                "panic.windowSeconds",
                f"must be <= windowSeconds ({self.panic.window_seconds} > {self.window_seconds})",
            )
        if self.scale_to_zero.enabled and not self.enabled:
            raise SpecError("scaleToZero.enabled", "needs autoscaling enabled: true")
        return self


ROLLOUT_STRATEGIES = ("rolling", "canary", "blueGreen")


@spec_type
class CanaryStepSpec:
    """One canary step: the new revision's share of new requests, held this long."""

    weight: Int = Field(ge=1, le=99)
    duration_seconds: Int = Field(default=60, ge=1, le=86400)


def _default_canary_steps() -> list[CanaryStepSpec]:
    return [CanaryStepSpec(weight=w, duration_seconds=60) for w in (5, 25, 50)]


@spec_type
class BlueGreenSpec:
    """The new revision at full size beside the old; traffic switches when it is ready, and
    the old revision stays (the instant way back) for `holdSeconds` while the analysis runs
    on the new one's traffic; then it is drained and removed."""

    hold_seconds: Int = Field(default=60, ge=1, le=86400)


@spec_type
class AnalysisQuerySpec:
    """A user's PromQL instant query (one number) that must stay at or under `max`."""

    promql: Annotated[Str, Field(min_length=1, max_length=4096)]
    max: Float


@spec_type
class AnalysisSpec:
    """What the new revision must show, on the router's measurements of each revision,
    before it gets more traffic. Ratios compare it with the stable revision; absolute limits
    hold whatever the stable one does. A limit with a default is always checked (loosen it
    to relax it); one without (the absolute p90s, the query) only when set."""

    min_requests: Int = Field(default=20, ge=1, le=1000000)
    max_error_rate: Float | None = Field(default=0.05, ge=0, le=1)
    max_error_rate_increase: Float | None = Field(default=0.02, ge=0, le=1)
    max_ttft_p90_seconds: Float | None = Field(default=None, gt=0, le=600)
    max_ttft_p90_ratio: Float | None = Field(default=1.5, ge=1, le=100)
    max_itl_p90_seconds: Float | None = Field(default=None, gt=0, le=60)
    max_itl_p90_ratio: Float | None = Field(default=1.5, ge=1, le=100)
    query: AnalysisQuerySpec | None = None


@spec_type
class RolloutSpec:
    """How a change to what the engine pods run (a revision) reaches traffic."""

    strategy: Annotated[Str, OneOf(ROLLOUT_STRATEGIES)] = "rolling"
    steps: list[CanaryStepSpec] = Field(default_factory=_default_canary_steps, min_length=1,
                                        max_length=20)
    blue_green: BlueGreenSpec = Field(default_factory=BlueGreenSpec)
    analysis: AnalysisSpec = Field(default_factory=AnalysisSpec)
    paused: Bool = False

    @model_validator(mode="after")
    def _steps_grow(self) -> RolloutSpec:
        weights = [s.weight for s in self.steps]
        for i in range(1, len(weights)):
            if weights[i] <= weights[i - 1]:
                raise SpecError(f"steps[{i}].weight", f"must grow step by step "
                                f"({weights[i]} after {weights[i - 1]})")
        return self


@spec_type
class PoolSpec:
    _: KW_ONLY
    model: ModelSpec
    engine: EngineSpec = Field(default_factory=EngineSpec)
    topology: TopologySpec
    routing: RoutingSpec = Field(default_factory=RoutingSpec)
    autoscaling: AutoscalingSpec = Field(default_factory=AutoscalingSpec)
    rollout: RolloutSpec = Field(default_factory=RolloutSpec)

    @model_validator(mode="after")
    def _consistent(self) -> PoolSpec:
        if self.model.scheme == "builtin" and self.engine.kind != "builtin":
            raise SpecError("model.source", "builtin:// models need engine.kind: builtin")
        builtin_name = (self.model.source or "").removeprefix("builtin://")
        if self.model.scheme == "builtin" and self.engine.runner == "torch" \
                and builtin_name not in contract.BUILTIN_MODELS:  # fmt: skip
            known = ", ".join(contract.BUILTIN_MODELS)
            raise UnservableSpecError(
                "model.source",
                f"unknown builtin model {builtin_name!r} for the torch runner; known: {known}")
        roles = self.topology.roles()
        for name, role in roles.items():
            if role.replicas.min == 0 and not self.autoscaling.scale_to_zero.enabled:
                raise SpecError(
                    f"topology.{name}.replicas.min",
                    "0 needs autoscaling.scaleToZero.enabled: true",
                )
        if self.autoscaling.scale_to_zero.enabled and all(
            role.replicas.min > 0 for role in roles.values()
        ):
            raise SpecError(
                "autoscaling.scaleToZero.enabled", "needs some role with replicas.min: 0"
            )
        if self.routing.gateway is not None and self.topology.unified is None:
            raise SpecError("routing.gateway", "needs a unified topology: the endpoint picker "
                            "does not run prefill/decode legs")
        _check_kv_sharing(self)
        # vLLM pools: flags that vLLM version rejects, block sizes a CPU build cannot use.
        check_vllm_engine(self.engine)
        return self


def _check_kv_sharing(spec: PoolSpec) -> None:
    """routing.kvSharing's cross-field rules (the CRD's CEL rules say the same)."""
    if not spec.routing.kv_sharing.enabled:
        return
    where = "routing.kvSharing.enabled"
    if not spec.engine.enable_prefix_caching:
        raise SpecError(where, "needs engine.enablePrefixCaching: true (there is no cached "
                        "prefix to share)")
    if spec.engine.is_builtin and spec.routing.prefix_mode != "precise":
        raise SpecError(where, "needs routing.prefixMode: precise with builtin engines (the "
                        "router finds the peer holding a prefix from their KV events)")
    if not spec.engine.is_builtin and spec.topology.is_disaggregated:
        raise SpecError(where, "with engine.kind: vllm needs a unified topology (prefill/"
                        "decode's NixlConnector owns --kv-transfer-config)")
    if not spec.engine.is_builtin and not spec.engine.image:
        raise SpecError(where, "with engine.kind: vllm needs engine.image: an image with "
                        "vLLM and LMCache (e.g. lmcache/vllm-openai); it runs the LMCache "
                        "server too")
