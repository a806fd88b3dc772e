"""status.observedGeneration (kstatus: Argo CD, Flux and `kubectl wait` read it) follows the
generation the operator acted on: after a reconcile, and when a spec is reported invalid."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from kvfleet_operator.api import SpecError, parse_pool
from kvfleet_operator.decide.reconcile import Observed, reconcile
from kvfleet_operator.runtimes.kubernetes.ports.status_store import status_dict, write_invalid_spec

WALL = datetime(2026, 1, 1, tzinfo=UTC)


def manifest(generation: int, observed: int) -> dict:
    return {
        "apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "ns", "generation": generation},
        "spec": {
            "model": {"name": "m", "source": "hf://org/m"},
            "engine": {"kind": "vllm"},
            "topology": {"unified": {"replicas": {"min": 1, "max": 2}}},
        },
        "status": {"observedGeneration": observed},
    }


@pytest.mark.parametrize("generation", [1, 2, 7])
def test_reconcile_reports_the_generation_it_acted_on(generation):
    pool = parse_pool(manifest(generation, observed=generation - 1))
    status = reconcile(pool, Observed(), now=0.0, wall=WALL).status
    assert status.observed_generation == generation
    assert status_dict(status)["observedGeneration"] == generation


class RecordingClient:
    def __init__(self) -> None:
        self.patches: list[tuple[str, dict]] = []

    async def merge_patch(self, path: str, body: dict) -> None:
        self.patches.append((path, body))


async def test_an_invalid_spec_is_reported_for_its_own_generation():
    body = manifest(generation=5, observed=4)
    client = RecordingClient()
    await write_invalid_spec(client, body, SpecError("spec.engine.blockSize", "bad"))  # type: ignore[arg-type]
    [(path, patch)] = client.patches
    assert path.endswith("/namespaces/ns/inferencepools/p/status")
    assert patch["status"]["observedGeneration"] == 5
