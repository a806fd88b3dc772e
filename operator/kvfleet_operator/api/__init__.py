"""InferencePool API (kvfleet.io/v1alpha1): typed spec and status, parsed with the CRD's rules."""

from .errors import SpecError
from .fields import to_dict
from .pool import (
    API_VERSION,
    CRD_NAME,
    GROUP,
    KIND,
    PLURAL,
    SHORT_NAME,
    VERSION,
    InferencePool,
    load_pool,
    parse_pool,
    parse_spec,
)
from .spec import (
    ENGINE_KINDS,
    ROLES,
    ROUTING_POLICIES,
    RUNNERS,
    AutoscalingSpec,
    EngineSpec,
    GatewaySpec,
    ImbalanceSpec,
    ModelSpec,
    PanicSpec,
    PoolSpec,
    ReplicasSpec,
    ResourcesSpec,
    RoleSpec,
    RoutingSpec,
    ScaleDownSpec,
    ScaleToZeroSpec,
    ScaleUpSpec,
    TargetsSpec,
    Toleration,
    TopologySpec,
    WeightsSpec,
)
from .status import (
    CONDITION_TYPES,
    FALSE,
    REASONS_BY_TYPE,
    TRUE,
    UNKNOWN,
    Condition,
    ConditionType,
    PoolStatus,
    Reason,
    RoleStatus,
    ScaleDecision,
    parse_status,
    rfc3339,
)

__all__ = [
    "API_VERSION", "CONDITION_TYPES", "CRD_NAME", "ENGINE_KINDS", "FALSE", "GROUP", "KIND",
    "PLURAL", "REASONS_BY_TYPE", "ROLES", "ROUTING_POLICIES", "RUNNERS", "SHORT_NAME", "TRUE",
    "UNKNOWN", "VERSION", "AutoscalingSpec", "Condition", "ConditionType", "EngineSpec",
    "GatewaySpec",
    "ImbalanceSpec", "InferencePool", "ModelSpec", "PanicSpec", "PoolSpec", "PoolStatus",
    "Reason", "ReplicasSpec", "ResourcesSpec", "RoleSpec", "RoleStatus", "RoutingSpec",
    "ScaleDecision", "ScaleDownSpec", "ScaleToZeroSpec", "ScaleUpSpec", "SpecError",
    "TargetsSpec", "Toleration", "TopologySpec", "WeightsSpec", "load_pool", "parse_pool",
    "parse_spec",
    "parse_status", "rfc3339", "to_dict",
]
