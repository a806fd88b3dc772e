"""docs/inferencepool.md is generated from the CRD and covers every field and example."""

from __future__ import annotations

import re

from kvfleet_operator.tools import crd_docs
from pool_corpus import EXAMPLES, ROOT, SCHEMA, walk

DOC = ROOT / "docs" / "inferencepool.md"


def sections(text: str) -> dict[str, str]:
    parts = re.split(r"^### `([^`]+)`$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def doc_path(path: str) -> str:
    path = re.sub(r"topology\.(unified|prefill|decode)", "topology.<role>", path)
    return path.replace("status.roles.*", "status.roles.<role>")


def test_committed_doc_is_the_generated_one():
    assert DOC.read_text(encoding="utf-8") == crd_docs.render(), (
        "docs/inferencepool.md is stale: run "
        "`python -m kvfleet_operator.tools.crd_docs > docs/inferencepool.md`"
    )


def test_every_crd_field_has_a_row_with_its_description():
    by_section = sections(DOC.read_text(encoding="utf-8"))
    checked = 0
    for path, node in walk(SCHEMA):
        if "." not in path or path.startswith("metadata"):
            continue
        parent, key = path.rsplit(".", 1)
        if key == "*" or key.endswith("[]"):  # map values and list items: their parent's row
            continue
        section = by_section.get(doc_path(parent))
        if section is None:  # a map of scalars (nodeSelector, requests) is one row upstairs
            continue
        row = next((line for line in section.splitlines() if line.startswith(f"| `{key}` |")),
                   None)
        assert row is not None, path
        assert " ".join(node["description"].split()).replace("|", "\\|") in row, path
        checked += 1
    assert checked > 80


def test_every_example_is_explained_field_by_field():
    by_section = sections(DOC.read_text(encoding="utf-8"))
    for example in EXAMPLES:
        section = by_section[f"examples/{example.name}"]
        assert "spec.model.source" in section and "spec.topology." in section
        rows = [line for line in section.splitlines() if line.startswith("| `")]
        assert all(row.rstrip(" |").split("|")[-1].strip() for row in rows), example.name
        assert len(rows) >= 15


def test_doc_says_how_to_validate_offline():
    text = DOC.read_text(encoding="utf-8")
    assert "--dry-run=client" in text and "kubernetes-validate" in text
    assert "cel-python" in text and "kvfleet_operator.tools.crd_validate" in text
    assert "kvpool" in text and "not `infpool`" in text


def test_doc_lists_every_printer_column_and_condition_reason():
    from kvfleet_operator.api import REASONS_BY_TYPE
    from pool_corpus import CRD

    text = DOC.read_text(encoding="utf-8")
    columns = text.split("## `kubectl get kvpool` columns", 1)[1].split("\n## ", 1)[0]
    for column in CRD["spec"]["versions"][0]["additionalPrinterColumns"]:
        assert f"| {column['name']} | {column['type']} | `{column['jsonPath']}` |" in columns
    assert "| Rollout | string | `.status.rollout.phase` |" in columns
    conditions = text.split("## Conditions", 1)[1].split("\n## ", 1)[0]
    for type_, reasons in REASONS_BY_TYPE.items():
        row = next(line for line in conditions.splitlines() if line.startswith(f"| `{type_}` |"))
        assert all(f"`{r}`" in row for r in reasons), type_
    assert "`RolloutInProgress`, `RolloutPaused`" in conditions and "`RollbackSLO`" in conditions
