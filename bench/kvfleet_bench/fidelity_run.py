"""The shared ending of bench/sim_fidelity.py's three comparisons (latency, `--routing`,
`--autoscaling`): run, write the JSON, print the summary, refresh the README section, and
exit 0 (pass), 1 (a verdict: over tolerance) or 2 (the run could not be made)."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvfleet_bench.readme import refresh_section


def finish(label: str, compute: Callable[[], dict[str, Any]], out_path: Path,
           summary: Callable[[dict[str, Any]], str],
           passed: Callable[[dict[str, Any]], bool]) -> int:
    try:
        out = compute()
    except (OSError, ValueError, RuntimeError) as exc:
        print(f"{label}: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1))
    print(summary(out))
    print(f"wrote {out_path}")
    refresh_section("sim_fidelity", out_path)
    return 0 if passed(out) else 1
