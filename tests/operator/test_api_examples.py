"""Every example pool parses with the typed API, and the typed API keeps what it was given."""

from pathlib import Path

import pytest
from kvfleet_operator.api import load_pool, to_dict

EXAMPLES = sorted((Path(__file__).parents[2] / "examples").glob("*.yaml"))


def test_examples_exist():
    names = {p.name for p in EXAMPLES}
    assert {"local-cpu.yaml", "local-sim.yaml", "vllm-unified.yaml",
            "vllm-disaggregated.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_parses(path):
    pool = load_pool(path)
    assert pool.spec.model.source
    assert pool.spec.topology.roles()


def test_local_cpu_shape():
    spec = load_pool(EXAMPLES[0].parent / "local-cpu.yaml").spec
    assert spec.engine.kind == "builtin" and spec.engine.runner == "torch"
    assert spec.model.source == "builtin://smollm2-135m"
    unified = spec.topology.unified
    assert unified is not None and (unified.replicas.min, unified.replicas.max) == (1, 3)
    assert spec.topology.mode == "unified"


def test_disaggregated_shape():
    spec = load_pool(EXAMPLES[0].parent / "vllm-disaggregated.yaml").spec
    assert spec.topology.is_disaggregated
    roles = spec.topology.roles()
    assert list(roles) == ["prefill", "decode"]
    assert (roles["prefill"].replicas.min, roles["prefill"].replicas.max) == (1, 4)
    assert (roles["decode"].replicas.min, roles["decode"].replicas.max) == (2, 16)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_round_trip_through_to_dict(path):
    import yaml

    raw = yaml.safe_load(path.read_text())
    spec = load_pool(path).spec
    out = to_dict(spec)
    # Everything the user wrote survives; defaults are only added, never changed.
    def contains(big, small, where="spec"):
        if isinstance(small, dict):
            for k, v in small.items():
                assert k in big, f"{where}.{k} lost"
                contains(big[k], v, f"{where}.{k}")
        else:
            assert big == small, f"{where}: {big!r} != {small!r}"
    contains(out, raw["spec"])
