"""docs/install.md's examples are real: every YAML block parses, the built-in kinds
validate (kubernetes-validate), the NetworkPolicy that lets Prometheus in selects the
builders' engine pods on their ports, and every file it links exists."""

from __future__ import annotations

import re

import kubernetes_validate
import yaml
from chart_render import ROOT, of_kind, pool_children

DOC = ROOT / "docs" / "install.md"


def _yaml_blocks() -> list[dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", DOC.read_text(), flags=re.S)
    return [doc for block in blocks for doc in yaml.safe_load_all(block) if doc]


def test_every_yaml_block_parses_and_builtin_kinds_validate():
    docs = _yaml_blocks()
    kinds = {d["kind"] for d in docs}
    assert {"Application", "GitRepository", "HelmRelease", "NetworkPolicy"} <= kinds
    for doc in docs:
        if doc["apiVersion"] == "networking.k8s.io/v1":
            kubernetes_validate.validate(doc, "1.30.0", strict=True)
    release = next(d for d in docs if d["kind"] == "HelmRelease")
    assert release["metadata"]["namespace"] == "kvfleet-system"
    assert release["spec"]["chart"]["spec"]["chart"] == "./charts/kvfleet"
    app = next(d for d in docs if d["kind"] == "Application")
    assert app["spec"]["destination"]["namespace"] == "kvfleet-system"
    assert app["spec"]["source"]["path"] == "charts/kvfleet"


def test_the_prometheus_policy_selects_every_engine_pod_on_its_port():
    [policy] = [d for d in _yaml_blocks() if d["kind"] == "NetworkPolicy"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    ports = {p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]}
    for name, objs in pool_children().items():
        for deployment in of_kind(objs, "Deployment"):
            labels = deployment["spec"]["template"]["metadata"]["labels"]
            if labels.get("app.kubernetes.io/component") != "engine":
                assert not selector.items() <= labels.items(), name  # not the routers
                continue
            assert selector.items() <= labels.items(), name
            engine = deployment["spec"]["template"]["spec"]["containers"][0]
            assert {p["containerPort"] for p in engine["ports"]} & ports, name


def test_linked_files_exist_and_the_images_section_is_there():
    text = DOC.read_text()
    links = re.findall(r"\]\((\.\./[^)#]+|[a-z-]+\.md)\)", text)
    assert links
    for link in links:
        assert (DOC.parent / link).resolve().exists(), link
    assert "\n## Images\n\n" in text and "[images.md](images.md)" in text
    for command in ("kubectl apply --server-side -f charts/kvfleet/crds/",
                    "helm install kvfleet charts/kvfleet -n kvfleet-system",
                    "helm upgrade kvfleet charts/kvfleet"):  # fmt: skip
        assert command in text
