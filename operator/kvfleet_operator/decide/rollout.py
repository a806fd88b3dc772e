"""Rollouts, pure: which engine template (revision) each replica should run, how many of each,
and what share of new requests each revision gets.

A revision names what the engine pods run: the model, the engine section (image, args, every
engine field) and each role's pod settings (GPUs, resources, placement). Replica counts,
routing and autoscaling are not part of it: changing them changes no pod.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.api.validation import to_dict

REVISION_LENGTH = 10  # hex digits: short enough for a label and a Deployment name


def revision_of(spec: PoolSpec) -> str:
    """The revision of what `spec`'s engine pods run (a stable hash, 10 hex digits)."""
    data = to_dict(spec)
    pods: dict[str, Any] = {
        "model": data["model"],
        "engine": data.get("engine", {}),
        "roles": {
            name: {k: v for k, v in role.items() if k != "replicas"}
            for name, role in data["topology"].items()
        },
    }
    text = json.dumps(pods, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:REVISION_LENGTH]
