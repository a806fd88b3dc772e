"""Shared helpers for the InferencePool tests: the CRD, the examples and the bad-pool corpus."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from kvfleet_operator.tools.crd_validate import compile_rules, load_crd, pool_schema

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
BAD_POOLS = Path(__file__).with_name("bad_pools.yaml")
CRD = load_crd()
SCHEMA = pool_schema(CRD)
NUM_CEL_RULES = compile_rules(SCHEMA)  # before hypothesis runs: lark raises the recursion limit
DELETE = "~delete"


def walk(schema: dict[str, Any], path: str = "") -> Any:
    """Yield (path, node) for every schema node: properties, map values, list items."""
    yield path, schema
    for key, sub in (schema.get("properties") or {}).items():
        yield from walk(sub, f"{path}.{key}" if path else key)
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}.*")
    if isinstance(schema.get("items"), dict):
        yield from walk(schema["items"], f"{path}[]")


def cel_messages() -> set[str]:
    return {r["message"] for _, n in walk(SCHEMA) for r in n.get("x-kubernetes-validations", [])}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def bad_pool_cases() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    doc = load_yaml(BAD_POOLS)
    return doc["base"], doc["cases"]


def build_case(base: dict[str, Any], case: dict[str, Any]) -> Any:
    """The manifest a corpus case describes: `manifest`, or `base` with `set` applied."""
    if "manifest" in case:
        return copy.deepcopy(case["manifest"])
    manifest = copy.deepcopy(base)
    for path, value in case["set"].items():
        *parents, leaf = path.split(".")
        node = manifest
        for part in parents:
            node = node.setdefault(part, {})
        if value == DELETE:
            node.pop(leaf, None)
        else:
            node[leaf] = copy.deepcopy(value)
    return manifest
