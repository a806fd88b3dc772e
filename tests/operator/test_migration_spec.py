"""`spec.routing.migration`: on by default, switchable per pool, handed to the router."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from kvfleet_operator.api import SpecError, parse_pool
from kvfleet_operator.decide.router_config import RouterEndpoint, build_router_config
from kvfleet_operator.tools.crd_validate import load_crd, pool_schema, schema_violations
from kvfleet_router.config import RouterConfig

EXAMPLES = Path(__file__).parents[2] / "examples"
EPS = [RouterEndpoint("p-0", "http://10.0.0.1:8000", "unified")]


def manifest(**migration):
    data = yaml.safe_load((EXAMPLES / "local-cpu.yaml").read_text())
    if migration:
        data["spec"].setdefault("routing", {})["migration"] = migration
    return data


def test_on_by_default_with_two_migrations():
    config = RouterConfig.from_dict(build_router_config(parse_pool(manifest()).spec, EPS, 1))
    assert config.migration.enabled is True and config.migration.max_migrations == 2


def test_a_pool_switches_it_off_or_bounds_it():
    off = build_router_config(parse_pool(manifest(enabled=False)).spec, EPS, 1)
    assert RouterConfig.from_dict(off).migration.enabled is False
    one = build_router_config(parse_pool(manifest(maxMigrations=1)).spec, EPS, 1)
    assert RouterConfig.from_dict(one).migration.max_migrations == 1


@pytest.mark.parametrize("bad", [0, 11, "2"])
def test_out_of_range_is_refused_by_the_spec_and_the_crd(bad):
    with pytest.raises(SpecError, match="maxMigrations"):
        parse_pool(manifest(maxMigrations=bad))
    found = schema_violations(pool_schema(load_crd()), manifest(maxMigrations=bad))
    assert [v.path for v in found] == ["spec.routing.migration.maxMigrations"]
