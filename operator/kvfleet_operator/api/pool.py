"""The InferencePool resource: identity, spec, status; `parse_pool` and `load_pool`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import SpecError
from .spec import PoolSpec
from .status import PoolStatus, parse_status
from .validation import to_dict, type_name, validate

GROUP = "kvfleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InferencePool"
PLURAL = "inferencepools"
SINGULAR = "inferencepool"
SHORT_NAME = "kvpool"
CRD_NAME = f"{PLURAL}.{GROUP}"

# Pool names prefix Deployments and Services ("<pool>-prefill", "<pool>-router"), so they
# must be DNS-1035 labels with room for a suffix.
POOL_NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
MAX_POOL_NAME = 40
# `kubectl annotate kvpool NAME kvfleet.io/rollout-promote=REVISION`: skip the remaining
# steps of the rollout of REVISION (any other value is ignored).
PROMOTE_ANNOTATION = "kvfleet.io/rollout-promote"


@dataclass(slots=True)
class InferencePool:
    name: str
    spec: PoolSpec
    namespace: str = "default"
    generation: int = 1
    uid: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    status: PoolStatus = field(default_factory=PoolStatus)
    annotations: dict[str, str] = field(default_factory=dict)

    @property
    def promote_revision(self) -> str | None:
        """The revision the pool's promote annotation names, if any."""
        return self.annotations.get(PROMOTE_ANNOTATION) or None

    def to_dict(self) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if self.labels:
            metadata["labels"] = dict(self.labels)
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": metadata,
                "spec": to_dict(self.spec)}


def parse_spec(data: Any, path: str = "spec") -> PoolSpec:
    return validate(PoolSpec, data, path)


def parse_pool(manifest: Any) -> InferencePool:
    """Parse and default an InferencePool manifest; problems raise SpecError naming the field."""
    if not isinstance(manifest, dict):
        raise SpecError("", f"an InferencePool must be an object, got {type_name(manifest)}")
    if manifest.get("apiVersion") != API_VERSION:
        raise SpecError("apiVersion", f"must be {API_VERSION}, got {manifest.get('apiVersion')!r}")
    if manifest.get("kind") != KIND:
        raise SpecError("kind", f"must be {KIND}, got {manifest.get('kind')!r}")
    metadata = manifest.get("metadata")
    if not isinstance(metadata, dict):
        raise SpecError("metadata", "must be an object with a name")
    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError("metadata.name", "required: the pool's name")
    if len(name) > MAX_POOL_NAME or not re.fullmatch(POOL_NAME_PATTERN, name):
        raise SpecError(
            "metadata.name",
            f"must be a DNS-1035 label of at most {MAX_POOL_NAME} characters, got {name!r}",
        )
    namespace = metadata.get("namespace", "default")
    if not isinstance(namespace, str) or not namespace:
        raise SpecError("metadata.namespace", f"must be a string, got {type_name(namespace)}")
    labels = metadata.get("labels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise SpecError("metadata.labels", "must map strings to strings")
    annotations = metadata.get("annotations") or {}
    if not isinstance(annotations, dict):
        raise SpecError("metadata.annotations", "must map strings to strings")
    if "spec" not in manifest:
        raise SpecError("spec", "required field is missing")
    generation = metadata.get("generation", 1)
    uid = metadata.get("uid")
    return InferencePool(
        name=name,
        namespace=namespace,
        generation=generation if isinstance(generation, int) and generation > 0 else 1,
        uid=uid if isinstance(uid, str) else None,
        labels=dict(labels),
        annotations={str(k): v for k, v in annotations.items() if isinstance(v, str)},
        spec=parse_spec(manifest["spec"]),
        status=parse_status(manifest.get("status")),
    )


def load_pool(path: str | Path) -> InferencePool:
    """Read one InferencePool from a YAML file (for `kvfleet up pool.yaml`)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError("", f"{path}: cannot read: {exc}") from None
    try:
        documents = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise SpecError("", f"{path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if len(documents) != 1:
        raise SpecError("", f"{path}: expected exactly one InferencePool, found {len(documents)}")
    return parse_pool(documents[0])
