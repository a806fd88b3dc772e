"""InferencePool spec types (kvfleet.io/v1alpha1). Mirrors crds/inferencepools.kvfleet.io.yaml.

Field rules sit in `spec_field(...)`; cross-field rules (the CRD's CEL rules) sit in
`__post_init__` and raise SpecError with the path relative to the object.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvfleet_engine import contract
from kvfleet_router.config import PREFIX_MODES, PolicyConfig

from .errors import SpecError, UnservableSpecError
from .fields import Rule, spec_field
from .vllm_compat import check_vllm_engine

ENGINE_KINDS = ("vllm", "builtin")
RUNNERS = ("torch", "simulated")
ROUTING_POLICIES = (
    "cache-aware", "prefix-cache", "least-kv", "least-request", "round-robin",
    "random", "session", "latency", "ucb", "slo",
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


@dataclass(slots=True)
class ModelSpec:
    name: str = spec_field(is_required=True, min_length=1, max_length=256)
    source: str | None = spec_field(None, pattern=SOURCE_PATTERN, max_length=1024)
    served_model_name: str | None = spec_field(None, min_length=1, max_length=256)

    def __post_init__(self) -> None:
        if not self.source:
            raise SpecError("source", f"a model source is required ({SOURCE_HELP})")

    @property
    def scheme(self) -> str:
        return (self.source or "").split("://", 1)[0]

    @property
    def api_name(self) -> str:
        """The model name clients send in requests."""
        return self.served_model_name or self.name


@dataclass(slots=True)
class EngineSpec:
    kind: str = spec_field("vllm", enum=ENGINE_KINDS)
    image: str | None = spec_field(None, min_length=1, max_length=512)
    args: list[str] = spec_field(default_factory=list, max_items=64, items=Rule(max_length=1024))
    runner: str = spec_field("torch", enum=RUNNERS)
    profile: str | None = spec_field(None, pattern=NAME_PATTERN, max_length=63)
    max_num_seqs: int = spec_field(256, minimum=1, maximum=65536)
    max_num_batched_tokens: int = spec_field(8192, minimum=1, maximum=1048576)
    max_model_len: int | None = spec_field(None, minimum=16, maximum=1048576)
    block_size: int = spec_field(16, minimum=1, maximum=256)
    enable_prefix_caching: bool = spec_field(True)
    gpu_memory_utilization: float = spec_field(0.9, minimum=0, exclusive_minimum=True, maximum=1)
    num_blocks: int | None = spec_field(None, minimum=2, maximum=16777216)

    def __post_init__(self) -> None:
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

    @property
    def is_builtin(self) -> bool:
        return self.kind == "builtin"


@dataclass(slots=True)
class ReplicasSpec:
    min: int = spec_field(1, minimum=0, maximum=1000)
    max: int = spec_field(1, minimum=0, maximum=1000)

    def __post_init__(self) -> None:
        if self.max < 1:
            raise SpecError("max", f"must be >= 1, got {self.max}")
        if self.min > self.max:
            raise SpecError("min", f"must be <= max ({self.min} > {self.max})")


@dataclass(slots=True)
class ResourcesSpec:
    requests: dict[str, str] | None = spec_field(None, max_items=16, items=Rule(is_quantity=True))
    limits: dict[str, str] | None = spec_field(None, max_items=16, items=Rule(is_quantity=True))


@dataclass(slots=True)
class Toleration:
    key: str | None = spec_field(None, max_length=253)
    operator: str = spec_field("Equal", enum=("Equal", "Exists"))
    value: str | None = spec_field(None, max_length=63)
    effect: str | None = spec_field(None, enum=("NoSchedule", "PreferNoSchedule", "NoExecute"))
    toleration_seconds: int | None = spec_field(None, minimum=0)

    def __post_init__(self) -> None:
        if self.operator == "Exists" and self.value is not None:
            raise SpecError("value", "must be empty when operator is Exists")
        if self.operator == "Equal" and self.key is None:
            raise SpecError("key", "is required when operator is Equal")
        if self.toleration_seconds is not None and self.effect != "NoExecute":
            raise SpecError("tolerationSeconds", "only applies with effect NoExecute")


@dataclass(slots=True)
class RoleSpec:
    replicas: ReplicasSpec = spec_field(default_factory=ReplicasSpec)
    gpus: int = spec_field(0, minimum=0, maximum=16)
    resources: ResourcesSpec | None = spec_field(None)
    node_selector: dict[str, str] | None = spec_field(None, max_items=32, items=Rule(max_length=63))
    tolerations: list[Toleration] | None = spec_field(None, max_items=32)

    def __post_init__(self) -> None:
        limits = (self.resources.limits if self.resources else None) or {}
        if self.gpus > 0 and GPU_RESOURCE in limits:
            raise SpecError(
                "gpus", f"set gpus or resources.limits[{GPU_RESOURCE}], not both"
            )


@dataclass(slots=True)
class TopologySpec:
    unified: RoleSpec | None = spec_field(None)
    prefill: RoleSpec | None = spec_field(None)
    decode: RoleSpec | None = spec_field(None)

    def __post_init__(self) -> None:
        split = self.prefill is not None or self.decode is not None
        if self.unified is not None and split:
            raise SpecError("unified", "cannot be combined with prefill/decode; choose one mode")
        if self.unified is None and not split:
            raise SpecError("", "set either unified, or both prefill and decode")
        if split and (self.prefill is None or self.decode is None):
            missing = "decode" if self.decode is None else "prefill"
            raise SpecError(missing, "is required: prefill and decode come as a pair")

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


def _weight() -> Any:
    return spec_field(None, minimum=0, maximum=100)


@dataclass(slots=True)
class WeightsSpec:
    """Scorer weights for cache-aware routing; unset ones keep the router's default."""

    prefix: float | None = _weight()
    queue: float | None = _weight()
    kv: float | None = _weight()
    session: float | None = _weight()
    latency: float | None = _weight()
    ucb: float | None = _weight()
    slo: float | None = _weight()


@dataclass(slots=True)
class ImbalanceSpec:
    abs_threshold: int = spec_field(8, minimum=0, maximum=100000)
    rel_threshold: float = spec_field(1.5, minimum=1, maximum=100)


@dataclass(slots=True)
class GatewaySpec:
    """Serve the pool behind a Gateway API Inference Extension gateway: the operator adds a
    GIE `inference.networking.k8s.io/v1` InferencePool over the engine pods and kvfleet's
    endpoint picker (`kvfleet router --epp-port`) as its Deployment and Service."""

    kind: str = spec_field("gie", enum=GATEWAY_KINDS)
    failure_mode: str = spec_field("FailClose", enum=GATEWAY_FAILURE_MODES)


@dataclass(slots=True)
class KVSharingSpec:
    """Fleet-wide KV: builtin engines fetch a prompt's cached prefix from the peer that
    holds it when the router estimates that beats recomputing it (by `margin`); vLLM
    engines share KV through an LMCache server (Kubernetes only). Off by default until
    measured to help."""

    enabled: bool = spec_field(False)
    margin: float = spec_field(1.5, minimum=1, maximum=100)


@dataclass(slots=True)
class RoutingSpec:
    policy: str = spec_field("cache-aware", enum=ROUTING_POLICIES)
    weights: WeightsSpec | None = spec_field(None)
    imbalance: ImbalanceSpec = spec_field(default_factory=ImbalanceSpec)
    session_header: str = spec_field("x-session-id", pattern=HEADER_PATTERN, max_length=128)
    replicas: int = spec_field(1, minimum=1, maximum=32)
    pd_threshold_tokens: int = spec_field(128, minimum=0, maximum=1048576)
    placement: str = spec_field("deployment", enum=ROUTER_PLACEMENTS)
    prefix_mode: str = spec_field("approximate", enum=PREFIX_MODES)
    gateway: GatewaySpec | None = spec_field(None)
    kv_sharing: KVSharingSpec = spec_field(default_factory=KVSharingSpec)

    def __post_init__(self) -> None:
        merged = self.effective_weights()
        if merged is not None and not any(merged.values()):
            raise UnservableSpecError(
                "weights", "are all zero, so no scorer would count; leave them unset for the "
                "router's defaults")

    def effective_weights(self) -> dict[str, float] | None:
        """The spec's weights over the router's defaults (the router replaces the whole map),
        or None to keep the router's defaults."""
        if self.weights is None:
            return None
        merged = dict(PolicyConfig().weights)
        for name in self.weights.__slots__:
            value = getattr(self.weights, name)
            if value is not None:
                merged[name] = float(value)
        return dict(sorted(merged.items()))


def _target(maximum: float) -> dict[str, Any]:
    # Autoscaling targets: open lower bound at 0, checked by CEL rules in the CRD.
    return dict(minimum=0, exclusive_minimum=True, maximum=maximum, by_cel=True)


@dataclass(slots=True)
class TargetsSpec:
    waiting_per_replica: float = spec_field(2.0, **_target(10000))
    kv_cache_usage: float = spec_field(0.8, **_target(1))
    running_per_replica: float | None = spec_field(None, **_target(100000))
    ttft_p90_seconds: float | None = spec_field(None, **_target(600))
    itl_p90_seconds: float | None = spec_field(None, **_target(60))
    prefill_tokens_per_second_per_replica: float | None = spec_field(
        None, **_target(10000000)
    )


@dataclass(slots=True)
class ScaleUpSpec:
    stabilization_window_seconds: int = spec_field(0, minimum=0, maximum=3600)
    max_step: int = spec_field(4, minimum=1, maximum=1000)
    cooldown_seconds: int = spec_field(15, minimum=0, maximum=3600)


@dataclass(slots=True)
class ScaleDownSpec:
    stabilization_window_seconds: int = spec_field(300, minimum=0, maximum=3600)
    max_step: int = spec_field(1, minimum=1, maximum=1000)
    cooldown_seconds: int = spec_field(60, minimum=0, maximum=3600)


@dataclass(slots=True)
class PanicSpec:
    window_seconds: int = spec_field(6, minimum=1, maximum=600)
    threshold: float = spec_field(2.0, minimum=1, maximum=100)


@dataclass(slots=True)
class ScaleToZeroSpec:
    enabled: bool = spec_field(False)
    idle_seconds: int = spec_field(300, minimum=1, maximum=86400)


@dataclass(slots=True)
class AutoscalingSpec:
    enabled: bool = spec_field(True)
    interval_seconds: int = spec_field(10, minimum=1, maximum=3600)
    window_seconds: int = spec_field(60, minimum=1, maximum=3600)
    targets: TargetsSpec = spec_field(default_factory=TargetsSpec)
    scale_up: ScaleUpSpec = spec_field(default_factory=ScaleUpSpec)
    scale_down: ScaleDownSpec = spec_field(default_factory=ScaleDownSpec)
    panic: PanicSpec = spec_field(default_factory=PanicSpec)
    drain_timeout_seconds: int = spec_field(120, minimum=0, maximum=86400)
    scale_to_zero: ScaleToZeroSpec = spec_field(default_factory=ScaleToZeroSpec)

    def __post_init__(self) -> None:
        if self.panic.window_seconds > self.window_seconds:
            raise SpecError(
                "panic.windowSeconds",
                f"must be <= windowSeconds ({self.panic.window_seconds} > {self.window_seconds})",
            )
        if self.scale_to_zero.enabled and not self.enabled:
            raise SpecError("scaleToZero.enabled", "needs autoscaling enabled: true")


@dataclass(slots=True, kw_only=True)
class PoolSpec:
    model: ModelSpec = spec_field(is_required=True)
    engine: EngineSpec = spec_field(default_factory=EngineSpec)
    topology: TopologySpec = spec_field(is_required=True)
    routing: RoutingSpec = spec_field(default_factory=RoutingSpec)
    autoscaling: AutoscalingSpec = spec_field(default_factory=AutoscalingSpec)

    def __post_init__(self) -> None:
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
