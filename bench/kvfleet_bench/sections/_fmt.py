"""Formatting shared by the section renderers: medians with min–max, tables, units."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Sequence
from typing import Any

Fmt = Callable[[float], str]


def fixed(digits: int) -> Fmt:
    return lambda x: f"{x:,.{digits}f}"


def plain(digits: int) -> Fmt:
    """Fixed digits without thousands separators (for tables copied from .md files)."""
    return lambda x: f"{x:.{digits}f}"


def pct(digits: int = 1) -> Fmt:
    return lambda x: f"{100 * x:.{digits}f}%"


def times(digits: int = 2) -> Fmt:
    return lambda x: f"{x:.{digits}f}x"


def median(values: Iterable[float]) -> float:
    return float(statistics.median(list(values)))


def spread(values: Sequence[float], fmt: Fmt) -> str:
    """`median (min–max)` of `values`; just the value when there is one."""
    values = [float(v) for v in values]
    if len(values) == 1:
        return fmt(values[0])
    return f"{fmt(median(values))} ({fmt(min(values))}–{fmt(max(values))})"


def stat(d: dict[str, Any], fmt: Fmt) -> str:
    """`median (min–max)` of a {median, min, max} summary."""
    return f"{fmt(d['median'])} ({fmt(d['min'])}–{fmt(d['max'])})"


def table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def code(*lines: str, lang: str = "") -> str:
    return "\n".join([f"```{lang}", *lines, "```"])


def ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")
