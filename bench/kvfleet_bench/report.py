"""Where a bench leaves its results: the JSON, and its markdown tables beside it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(out: Path, result: dict[str, Any], text: str) -> None:
    """`out` gets the JSON; the same path with `.md` gets `text` (the tables the README
    quotes), so one command reproduces both."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(text.rstrip("\n") + "\n")
