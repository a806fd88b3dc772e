"""Render charts/kvfleet offline with helm-python-sdk (Helm v4's own Go SDK; no binary)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import helm_python as helm
import yaml

ROOT = Path(__file__).parents[2]
CHART = ROOT / "charts" / "kvfleet"
RELEASE = "kvfleet"
NAMESPACE = "kvfleet-system"  # options.OPERATOR_NAMESPACE, the default
EXAMPLE_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
# Every values set the tests render: the defaults, and each example values file.
VALUE_SETS: dict[str, dict[str, Any] | None] = {
    "default": None,
    **{p.stem: yaml.safe_load(p.read_text()) for p in EXAMPLE_VALUES},
}


def render_raw(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> dict[str, str]:
    """Template path -> rendered text (NOTES.txt included)."""
    with helm.Chart.load(CHART) as chart:
        return chart.render(values, name=RELEASE, namespace=namespace)


def manifests(values: dict[str, Any] | None = None, namespace: str = NAMESPACE) -> list[dict]:
    """Every rendered object (not the CRDs: Helm installs crds/ apart from templates)."""
    out: list[dict] = []
    for path, text in sorted(render_raw(values, namespace).items()):
        if path.endswith(".yaml"):
            out += [doc for doc in yaml.safe_load_all(text) if doc]
    return out


def of_kind(objs: list[dict], kind: str) -> list[dict]:
    return [o for o in objs if o["kind"] == kind]


def one(objs: list[dict], kind: str) -> dict:
    [found] = of_kind(objs, kind)
    return found


def crd_documents() -> list[dict]:
    return [doc for p in sorted((CHART / "crds").glob("*.yaml"))
            for doc in yaml.safe_load_all(p.read_text()) if doc]  # fmt: skip


EXAMPLE_POOLS = sorted((ROOT / "examples").glob("*.yaml"))


def pool_children() -> dict[str, list[dict]]:
    """The operator's children of every example pool, and of each with its router as a
    sidecar (`routing.placement: sidecar`, where the engine port is `engine`) where the
    pool allows that."""
    from kvfleet_operator.api import SpecError, parse_pool
    from kvfleet_operator.runtimes.kubernetes import Tokens, build_children

    tokens = Tokens(admin="admin-token", engine="engine-token")
    out = {}
    for path in EXAMPLE_POOLS:
        data = yaml.safe_load(path.read_text())
        out[path.stem] = build_children(_pool(parse_pool, data), tokens=tokens)
        if data["spec"].get("routing", {}).get("placement", "deployment") != "deployment":
            continue
        data["spec"].setdefault("routing", {})["placement"] = "sidecar"
        try:
            pool = _pool(parse_pool, data)
        except SpecError:  # e.g. a pool behind a gateway: no sidecar variant
            continue
        out[f"{path.stem}-sidecar"] = build_children(pool, tokens=tokens)
    return out


def _pool(parse_pool, data: dict):
    pool = parse_pool(data)
    pool.uid = "00000000-0000-0000-0000-000000000001"
    return pool
