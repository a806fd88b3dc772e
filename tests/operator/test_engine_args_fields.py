"""Every engine spec field reaches the rendered args of every engine kind, or is named here
as not an argument (with why): a new field that neither renders nor is listed fails."""

import dataclasses

import pytest
from kvfleet_operator.api import parse_pool
from kvfleet_operator.api.spec import EngineSpec
from kvfleet_operator.decide.engine_args import engine_args

BASE = {
    "builtin": {"kind": "builtin", "runner": "simulated", "profile": "h100-llama3-8b"},
    "vllm": {"kind": "vllm"},
}
# field -> the changed value and, per kind, the flag it must reach (None: not an argument).
FIELDS = {
    "kind": None,  # picks the renderer itself
    "image": None,  # the container image, used by cluster runtimes, not a flag
    "args": (["--seed", "7"], {"builtin": "--seed", "vllm": "--seed"}),
    "runner": ("torch", {"builtin": "--runner", "vllm": None}),  # vLLM has one runner
    "profile": ("cpu-tiny", {"builtin": "--profile", "vllm": None}),  # builtin timing only
    "max_num_seqs": (7, {"builtin": "--max-num-seqs", "vllm": "--max-num-seqs"}),
    "max_num_batched_tokens": (
        9000, {"builtin": "--max-num-batched-tokens", "vllm": "--max-num-batched-tokens"}),
    "max_model_len": (2048, {"builtin": "--max-model-len", "vllm": "--max-model-len"}),
    "block_size": (32, {"builtin": "--block-size", "vllm": "--block-size"}),
    "enable_prefix_caching": (
        False, {"builtin": "--no-enable-prefix-caching", "vllm": "--no-enable-prefix-caching"}),
    # The builtin engine sizes its KV cache by blocks (numBlocks), not by memory share.
    "gpu_memory_utilization": (0.5, {"builtin": None, "vllm": "--gpu-memory-utilization"}),
    "num_blocks": (333, {"builtin": "--num-blocks", "vllm": "--num-gpu-blocks-override"}),
}
SOURCES = {"builtin": "builtin://tiny-random", "vllm": "hf://meta-llama/Llama-3.1-8B"}


def _spec(kind, **changes):
    engine = dict(BASE[kind])
    for name, value in changes.items():
        engine[_camel(name)] = value
    return parse_pool({
        "apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool", "metadata": {"name": "p"},
        "spec": {"model": {"name": "m", "source": SOURCES[kind]}, "engine": engine,
                 "topology": {"unified": {"replicas": {"min": 1, "max": 2}}}},
    }).spec  # fmt: skip


def _camel(name):
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def test_every_engine_field_is_listed():
    assert set(FIELDS) == {f.name for f in dataclasses.fields(EngineSpec)}


@pytest.mark.parametrize("kind", ["builtin", "vllm"])
@pytest.mark.parametrize("name", [n for n, how in FIELDS.items() if how is not None])
def test_engine_field_reaches_the_args(kind, name):
    value, flags = FIELDS[name]
    flag = flags[kind]
    if flag is None:
        pytest.skip(f"{name} is not an argument of {kind} engines")
    before = engine_args(_spec(kind), "unified")
    after = engine_args(_spec(kind, **{name: value}), "unified")
    assert after != before, f"{name} changed nothing in the {kind} args"
    assert flag in after
    if isinstance(value, bool):
        assert flag not in before
    elif not isinstance(value, list):
        assert after[after.index(flag) + 1] == str(value)


def test_builtin_args_parse_with_the_engine_cli_and_keep_every_value():
    from kvfleet_engine.cli import build_parser

    values = {n: how[0] for n, how in FIELDS.items()
              if how is not None and how[1]["builtin"] is not None and n != "args"}  # fmt: skip
    spec = _spec("builtin", **values)
    ns = build_parser().parse_args(engine_args(spec, "unified"))
    assert ns.runner == "torch" and ns.profile == "cpu-tiny"
    assert (ns.max_num_seqs, ns.max_num_batched_tokens, ns.max_model_len) == (7, 9000, 2048)
    assert (ns.block_size, ns.num_blocks) == (32, 333)
    assert ns.enable_prefix_caching is False
