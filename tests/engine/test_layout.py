"""The engine's rooms: the core and the contract import without torch or aiohttp."""

from __future__ import annotations

import subprocess
import sys
from importlib import resources

import pytest

CORE = [
    "kvfleet_engine.contract",
    "kvfleet_engine.core.block_pool",
    "kvfleet_engine.core.config",
    "kvfleet_engine.core.engine",
    "kvfleet_engine.core.kv_cache",
    "kvfleet_engine.core.kv_calc",
    "kvfleet_engine.core.kv_transfer",
    "kvfleet_engine.core.output_processor",
    "kvfleet_engine.core.outputs",
    "kvfleet_engine.core.prefix_share",
    "kvfleet_engine.core.request_checks",
    "kvfleet_engine.core.runner_base",
    "kvfleet_engine.core.sampling_params",
    "kvfleet_engine.core.scheduler",
    "kvfleet_engine.core.sequence",
]


def _loaded_after(code: str) -> set[str]:
    probe = code + "\nimport sys; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, timeout=60,
                         capture_output=True, text=True).stdout
    return set(out.split())


@pytest.mark.parametrize("heavy", ["torch", "aiohttp"])
def test_core_and_contract_import_without_torch_or_aiohttp(heavy):
    loaded = _loaded_after("\n".join(f"import {name}" for name in CORE))
    assert set(CORE) <= loaded
    assert heavy not in loaded


def test_contract_alone_loads_no_engine_room():
    loaded = _loaded_after("import kvfleet_engine.contract")
    rooms = {m for m in loaded if m.startswith(("kvfleet_engine.core", "kvfleet_engine.server",
                                                "kvfleet_engine.runners", "kvfleet_engine.model"))}
    assert rooms == set()


def test_offline_api_is_exported_from_the_package_lazily():
    loaded = _loaded_after(
        "from kvfleet_engine import LLM, SamplingParams\n"
        "assert LLM.__module__ == 'kvfleet_engine.llm'\n"
        "assert SamplingParams(temperature=0.0).temperature == 0.0"
    )
    assert "torch" not in loaded and "aiohttp" not in loaded


def test_unknown_package_attribute_is_an_attribute_error():
    import kvfleet_engine

    with pytest.raises(AttributeError):
        _ = kvfleet_engine.NoSuchThing


def test_package_data_ships_with_the_rooms():
    profiles = resources.files("kvfleet_engine.runners") / "profiles"
    assert {"cpu-tiny.json", "h100-llama3-8b.json"} <= {p.name for p in profiles.iterdir()}
    csrc = resources.files("kvfleet_engine.model") / "csrc"
    assert {"attention.cpp", "gemm.cpp", "kernels.cpp", "kernels.h"} <= {
        p.name for p in csrc.iterdir()
    }


def test_the_contract_names_every_builtin_model_and_profile():
    from kvfleet_engine import contract
    from kvfleet_engine.model.registry import MODELS
    from kvfleet_engine.runners.cost_model import list_profiles

    assert tuple(sorted(MODELS)) == contract.BUILTIN_MODELS
    assert tuple(sorted(list_profiles())) == contract.BUILTIN_PROFILES
