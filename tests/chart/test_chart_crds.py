"""The chart ships the CRD byte for byte as crds/ has it (Helm installs charts/kvfleet/crds/
before the templates, and never upgrades it: docs/install.md says what to do)."""

from __future__ import annotations

import helm_python as helm
from chart_render import CHART, ROOT

SOURCE = ROOT / "crds"
COPY = CHART / "crds"


def test_the_chart_has_exactly_the_repositorys_crds():
    assert sorted(p.name for p in COPY.iterdir()) == sorted(p.name for p in SOURCE.glob("*.yaml"))


def test_each_crd_is_byte_identical():
    for source in SOURCE.glob("*.yaml"):
        assert (COPY / source.name).read_bytes() == source.read_bytes(), (
            f"charts/kvfleet/crds/{source.name} differs from crds/{source.name}: "
            f"cp crds/{source.name} charts/kvfleet/crds/"
        )


def test_helm_loads_them_as_crds():
    with helm.Chart.load(CHART) as chart:
        crds = chart.crds
    assert [c["filename"] for c in crds] == ["kvfleet/crds/inferencepools.kvfleet.io.yaml"]
    assert crds[0]["data"] == (SOURCE / "inferencepools.kvfleet.io.yaml").read_text()
