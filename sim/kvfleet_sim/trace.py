"""Request traces for the simulator: the Azure LLM inference traces (CSV), sliced and
time-compressed.

`load_azure_csv(path, start_s, duration_s, compress)` returns `TraceRequest`s with
arrival times relative to the slice start, divided by `compress` (compress 4 replays
ten minutes in 150 s, at four times the request rate; lengths are unchanged).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path


class TraceError(ValueError):
    """A trace file that cannot be read or sliced; the message names the file."""


@dataclass(slots=True, frozen=True)
class TraceRequest:
    t: float  # arrival, seconds from the slice start (after compression)
    num_prompt_tokens: int
    num_output_tokens: int


def _timestamp(text: str) -> datetime:
    # "2023-11-16 18:15:46.6805900": 7 fractional digits; Python takes at most 6.
    head, _, frac = text.strip().partition(".")
    return datetime.fromisoformat(f"{head}.{(frac or '0')[:6]}")


def load_azure_csv(
    path: str | Path, start_s: float = 0.0, duration_s: float = 600.0, compress: float = 1.0
) -> list[TraceRequest]:
    if duration_s <= 0 or compress <= 0 or start_s < 0:
        raise TraceError("need start_s >= 0, duration_s > 0 and compress > 0")
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    if not rows or [c.strip() for c in rows[0][:3]] != [
        "TIMESTAMP", "ContextTokens", "GeneratedTokens"
    ]:  # fmt: skip
        raise TraceError(
            f"{path}: not an Azure LLM trace (TIMESTAMP,ContextTokens,GeneratedTokens)"
        )
    out: list[TraceRequest] = []
    t0: datetime | None = None
    for i, row in enumerate(rows[1:], start=2):
        try:
            ts = _timestamp(row[0])
            num_prompt, num_output = int(row[1]), int(row[2])
        except (ValueError, IndexError):
            raise TraceError(f"{path}:{i}: malformed row {row!r}") from None
        t0 = t0 or ts
        t = (ts - t0).total_seconds() - start_s
        if t < 0:
            continue
        if t >= duration_s:
            break
        if num_prompt >= 1 and num_output >= 1:
            out.append(TraceRequest(t / compress, num_prompt, num_output))
    if not out:
        raise TraceError(f"{path}: no requests in [{start_s}, {start_s + duration_s}) s")
    return out
