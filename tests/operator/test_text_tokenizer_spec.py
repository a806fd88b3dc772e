"""routing.textTokenizerPath: the pool setting behind the router's prefix.tokenizer."""

import pytest
from kvfleet_operator.api import SpecError, parse_pool
from kvfleet_operator.decide.router_config import build_router_config
from kvfleet_router.config import RouterConfig

BASE = {"apiVersion": "kvfleet.io/v1alpha1", "kind": "InferencePool",
        "metadata": {"name": "p", "namespace": "default"},
        "spec": {"model": {"name": "m", "source": "hf://org/m"},
                 "topology": {"unified": {"replicas": {"min": 1, "max": 2}}}}}


def pool(routing: dict):
    return parse_pool({**BASE, "spec": {**BASE["spec"], "routing": routing}})


def test_a_tokenizer_path_reaches_the_router_config_with_the_precise_index():
    cfg = build_router_config(pool({"prefixMode": "precise",
                                    "textTokenizerPath": "/models/m"}).spec, [], 1)
    assert cfg["prefix"] == {"tokenizer": {"path": "/models/m"}}
    assert RouterConfig.from_dict(cfg).prefix.tokenizer.path == "/models/m"


def test_by_default_text_prompts_stay_on_the_approximate_index():
    cfg = build_router_config(pool({"prefixMode": "precise"}).spec, [], 1)
    assert "prefix" not in cfg
    assert RouterConfig.from_dict(cfg).prefix.tokenizer.path == ""


@pytest.mark.parametrize("routing,where", [
    ({"textTokenizerPath": "/models/m"}, "textTokenizerPath"),  # approximate index
    ({"prefixMode": "precise", "textTokenizerPath": "models/m"}, "textTokenizerPath"),
])
def test_a_tokenizer_path_without_the_precise_index_or_not_absolute_is_refused(routing, where):
    with pytest.raises(SpecError, match=where):
        pool(routing)
