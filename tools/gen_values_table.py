"""The values table of docs/install.md, generated from charts/kvfleet/values.yaml.

Each key's description is its `# --` comment (helm-docs style: the comment block right
above the key, starting with `# --`, continued by the `#` lines below it). Every leaf (and
every empty map or list) must have one, or sit under a documented map; a key without one is
an error, so a new value cannot land undocumented.

    python tools/gen_values_table.py            # print the table
    python tools/gen_values_table.py --write    # rewrite it in docs/install.md
    python tools/gen_values_table.py --check    # exit 1 when docs/install.md is stale
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
VALUES = ROOT / "charts" / "kvfleet" / "values.yaml"
DOC = ROOT / "docs" / "install.md"
START = "<!-- values-table:start (tools/gen_values_table.py --write) -->"
END = "<!-- values-table:end -->"

_KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z0-9_.-]+):(?:\s|$)")
_DOC = re.compile(r"^(?P<indent> *)# -- ?(?P<text>.*)$")
_MORE = re.compile(r"^(?P<indent> *)#(?: (?P<text>.*))?$")


def documented_keys(text: str) -> dict[tuple[str, ...], str]:
    """(path of keys) -> description, for every key with a `# --` comment above it."""
    docs: dict[tuple[str, ...], str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[str] | None = None
    for line in text.splitlines():
        if m := _DOC.match(line):
            pending = [m["text"].strip()]
        elif (m := _MORE.match(line)) and pending is not None:
            pending.append((m["text"] or "").strip())
        elif m := _KEY.match(line):
            indent = len(m["indent"])
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, m["key"]))
            if pending is not None:
                docs[tuple(k for _, k in stack)] = " ".join(p for p in pending if p)
            pending = None
        elif not line.strip().startswith("-"):
            pending = None  # a blank line or a plain comment ends a `# --` block
    return docs


def _type(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "list"
    return "object"


def _leaves(values: dict[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for key, value in values.items():
        path = (*prefix, key)
        if isinstance(value, dict) and value:
            out += [path] + _leaves(value, path)
        else:
            out.append(path)
    return out


def _lookup(values: dict[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = values
    for key in path:
        node = node[key]
    return node


def rows(text: str) -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) per documented key, in file order."""
    values = yaml.safe_load(text)
    docs = documented_keys(text)
    missing = [".".join(p) for p in _leaves(values)
               if not isinstance(_lookup(values, p), dict) or not _lookup(values, p)
               if not any(p[:n] in docs for n in range(1, len(p) + 1))]  # fmt: skip
    if missing:
        raise SystemExit(f"values.yaml keys without a `# --` comment: {', '.join(missing)}")
    stray = [".".join(p) for p in docs if p not in set(_leaves(values))]
    if stray:
        raise SystemExit(f"`# --` comments on no key of values.yaml: {', '.join(stray)}")
    out = []
    for path, description in docs.items():
        value = _lookup(values, path)
        default = json.dumps(value, separators=(",", ":"))
        out.append((".".join(path), _type(value), default, description))
    return out


def table(text: str) -> str:
    def cell(s: str) -> str:
        return s.replace("|", "\\|")

    lines = ["| Key | Type | Default | Description |", "|---|---|---|---|"]
    lines += [f"| `{key}` | {kind} | `{cell(default)}` | {cell(description)} |"
              for key, kind, default, description in rows(text)]  # fmt: skip
    return "\n".join(lines) + "\n"


def with_table(doc: str, generated: str) -> str:
    """`doc` with the text between the markers replaced by `generated`."""
    head, sep, rest = doc.partition(START)
    _, sep2, tail = rest.partition(END)
    if not sep or not sep2:
        raise SystemExit(f"docs/install.md lacks the markers {START} ... {END}")
    return f"{head}{START}\n{generated}{END}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help="rewrite the table in docs/install.md")
    mode.add_argument("--check", action="store_true", help="exit 1 if docs/install.md is stale")
    args = parser.parse_args(argv)
    generated = table(VALUES.read_text())
    if not (args.write or args.check):
        sys.stdout.write(generated)
        return 0
    doc = DOC.read_text()
    updated = with_table(doc, generated)
    if args.check:
        if updated != doc:
            print("docs/install.md's values table is stale: "
                  "run python tools/gen_values_table.py --write", file=sys.stderr)  # fmt: skip
            return 1
        return 0
    DOC.write_text(updated)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
