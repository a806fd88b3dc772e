"""Request traces for the simulator: the Azure LLM inference traces (CSV) and the Mooncake
conversation trace (JSONL with `hash_ids`), sliced, time-scaled and rate-multiplied.

    reqs = load_trace(path, start_s=0, duration_s=600, compress=2.0, rate=1.5)

* Slicing: requests arriving in [start_s, start_s + duration_s) of the trace's own time.
* `compress`: arrival times (relative to the slice start) are divided by it, so
  compress 4 replays ten minutes in 150 s at four times the request rate.
* Flow control: a Mooncake row may carry `tenant` (a non-empty string, default
  `default`, the router's default tenant) and `priority` (an integer, default 0, lower
  first as in vLLM); the simulated router's flow control (issue 28) reads both, as the
  live router reads `x-kvfleet-tenant` and `x-kvfleet-priority`. Copies keep them.
* `rate`: multiplies the request count over the same span. Request i gets
  floor((i+1)·rate) − floor(i·rate) copies (exact and deterministic; rate < 1 thins),
  spread evenly up to the next arrival. A copy of a Mooncake request gets its own
  `hash_ids` (shifted past the slice's largest id), so a copy is a new conversation of the
  same shape rather than extra hits on the original's prefix.

Prompts (`prompt_tokens`): a Mooncake `hash_id` stands for one 512-token block, and each id
expands deterministically into 512 pseudo-token ids (SHAKE-128 of the id, one byte per
token, so the same id always gives the same tokens and different ids different ones), or
the first `TraceRequest.block_tokens` of them; a prompt is its ids' blocks in order, cut
to `input_length`. Shared ids are thus shared
token prefixes, which the engines' prefix caches and the router's prefix index see. Azure
requests get fresh ids of their own (those traces have no prefix sharing to model).
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from itertools import chain
from pathlib import Path

MOONCAKE_BLOCK_TOKENS = 512
MAX_RATE = 1000.0
DEFAULT_TENANT = "default"  # the router's flow_control.default_tenant
MAX_TENANT_CHARS = 128
_AZURE_ID_BASE = 1 << 40  # synthetic hash ids for Azure requests, clear of Mooncake's


class TraceError(ValueError):
    """A trace file that cannot be read or sliced; the message names the file."""


@dataclass(slots=True, frozen=True)
class TraceRequest:
    t: float  # arrival, seconds from the slice start (after compression)
    num_prompt_tokens: int
    num_output_tokens: int
    hash_ids: tuple[int, ...] = ()  # one per 512-token block; () = unique to this request
    # tokens each hash id expands into (at most 512). A replay of the router benchmark's
    # fake backends (one hash id = 512 characters of text, 512 bytes to the router's
    # prefix index) gives 64: 64 token ids, which the router packs 8 bytes each.
    block_tokens: int = MOONCAKE_BLOCK_TOKENS
    tenant: str = DEFAULT_TENANT  # who asks (flow control's tenant)
    priority: int = 0  # the request's own priority, lower first (vLLM's convention)

    def __post_init__(self) -> None:
        if not 1 <= self.block_tokens <= MOONCAKE_BLOCK_TOKENS:
            raise TraceError(f"block_tokens must be in 1..{MOONCAKE_BLOCK_TOKENS}, "
                             f"got {self.block_tokens}")
        if problem := flow_fields_problem(self.tenant, self.priority):
            raise TraceError(problem)


def flow_fields_problem(tenant: object, priority: object) -> str | None:
    """Why a request's `tenant` / `priority` cannot be used, or None when they can."""
    if not isinstance(tenant, str) or not 1 <= len(tenant) <= MAX_TENANT_CHARS:
        return f"tenant must be a string of 1..{MAX_TENANT_CHARS} characters, got {tenant!r}"
    if not isinstance(priority, int) or isinstance(priority, bool):
        return f"priority must be an integer, got {priority!r}"
    return None


def _check_scaling(start_s: float, duration_s: float, compress: float) -> None:
    if not (math.isfinite(start_s) and start_s >= 0 and duration_s > 0
            and math.isfinite(compress) and compress > 0):  # fmt: skip
        raise TraceError("need start_s >= 0, duration_s > 0 and compress > 0")


def _timestamp(text: str) -> datetime:
    # "2023-11-16 18:15:46.6805900": 7 fractional digits; Python takes at most 6.
    head, _, frac = text.strip().partition(".")
    return datetime.fromisoformat(f"{head}.{(frac or '0')[:6]}")


def load_azure_csv(
    path: str | Path, start_s: float = 0.0, duration_s: float = 600.0, compress: float = 1.0
) -> list[TraceRequest]:
    _check_scaling(start_s, duration_s, compress)
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
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


@dataclass(slots=True, frozen=True)
class MooncakeRow:
    line: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]
    tenant: str = DEFAULT_TENANT
    priority: int = 0


def mooncake_rows(path: str | Path) -> Iterator[tuple[int, float, int, int, tuple[int, ...]]]:
    """(line number, timestamp ms, input_length, output_length, hash_ids) per row, checked
    as `mooncake_records` checks them."""
    for r in mooncake_records(path):
        yield r.line, r.timestamp_ms, r.input_length, r.output_length, r.hash_ids


def mooncake_records(path: str | Path) -> Iterator[MooncakeRow]:
    """One `MooncakeRow` per row, checked: a row that is not one JSON object with those
    fields raises TraceError naming its line (and, for a bad `tenant` or `priority`, why)."""
    try:
        with open(path, encoding="utf-8") as fh:
            for i, line in enumerate(fh, start=1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                    ts = float(row["timestamp"])
                    n_in, n_out = int(row["input_length"]), int(row["output_length"])
                    ids = tuple(int(h) for h in row["hash_ids"])
                    ok = math.isfinite(ts) and n_in >= 1 and n_out >= 1 and all(
                        h >= 0 for h in ids) and len(ids) * MOONCAKE_BLOCK_TOKENS >= n_in
                except (ValueError, KeyError, TypeError):
                    ok = False
                if not ok:
                    raise TraceError(f"{path}:{i}: malformed Mooncake row {line.strip()[:80]!r}")
                tenant, priority = row.get("tenant", DEFAULT_TENANT), row.get("priority", 0)
                if problem := flow_fields_problem(tenant, priority):
                    raise TraceError(f"{path}:{i}: {problem}")
                yield MooncakeRow(i, ts, n_in, n_out, ids, tenant, priority)
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None


def load_mooncake(
    path: str | Path, start_s: float = 0.0, duration_s: float = 3600.0, compress: float = 1.0
) -> list[TraceRequest]:
    """Mooncake JSONL: `timestamp` (ms), `input_length`, `output_length`, `hash_ids`, and
    optionally `tenant` and `priority` (flow control)."""
    _check_scaling(start_s, duration_s, compress)
    out: list[TraceRequest] = []
    t0: float | None = None
    for row in mooncake_records(path):
        ts = row.timestamp_ms
        t0 = ts if t0 is None else t0
        t = (ts - t0) / 1000.0 - start_s
        if 0 <= t < duration_s:
            out.append(TraceRequest(t / compress, row.input_length, row.output_length,
                                    row.hash_ids, tenant=row.tenant, priority=row.priority))
    if t0 is None:
        raise TraceError(f"{path}: no requests in the file")
    if not out:
        raise TraceError(f"{path}: no requests in [{start_s}, {start_s + duration_s}) s")
    out.sort(key=lambda r: r.t)
    return out


def multiply_rate(reqs: list[TraceRequest], rate: float) -> list[TraceRequest]:
    """The same span with `rate` times the requests (see the module docstring)."""
    if not (math.isfinite(rate) and 0 < rate <= MAX_RATE):
        raise TraceError(f"rate multiplier must be in (0, {MAX_RATE:g}], got {rate!r}")
    if rate == 1.0:
        return list(reqs)
    stride = 1 + max((max(r.hash_ids) for r in reqs if r.hash_ids), default=-1)
    out: list[TraceRequest] = []
    for i, r in enumerate(reqs):
        n = math.floor((i + 1) * rate) - math.floor(i * rate)
        gap = (reqs[i + 1].t - r.t) if i + 1 < len(reqs) else 0.0
        for c in range(n):
            ids = tuple(h + c * stride for h in r.hash_ids) if c and r.hash_ids else r.hash_ids
            out.append(dataclasses.replace(r, t=r.t + gap * c / n, hash_ids=ids))
    if not out:
        raise TraceError(f"rate multiplier {rate:g} leaves no requests")
    return out


def is_mooncake(path: str | Path) -> bool:
    """JSON lines (Mooncake) rather than an Azure CSV, judged by the first byte."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64).lstrip()
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror}") from None
    return head.startswith(b"{")


def load_trace(path: str | Path, start_s: float = 0.0, duration_s: float = 600.0,
               compress: float = 1.0, rate: float = 1.0) -> list[TraceRequest]:
    """Either format, sliced, time-scaled, then rate-multiplied."""
    load = load_mooncake if is_mooncake(path) else load_azure_csv
    return multiply_rate(load(path, start_s, duration_s, compress), rate)


@lru_cache(maxsize=16384)
def block_tokens(hash_id: int) -> tuple[int, ...]:
    """The 512 token ids (0..255) a hash id stands for: a pure function of the id."""
    seed = b"kvfleet-block:" + hash_id.to_bytes(8, "little", signed=False)
    return tuple(hashlib.shake_128(seed).digest(MOONCAKE_BLOCK_TOKENS))


def prompt_tokens(req: TraceRequest, index: int, max_tokens: int) -> list[int]:
    """The request's prompt, at most `max_tokens` (>= 1) long. `index` (the request's place
    in the trace) names the fresh blocks of a request without `hash_ids`."""
    n = max(1, min(req.num_prompt_tokens, max_tokens))
    size = req.block_tokens
    ids: tuple[int, ...] | range = req.hash_ids
    if not ids:
        first = _AZURE_ID_BASE + index * 1024
        ids = range(first, first + -(-n // size))
    num_blocks = -(-n // size)
    if size == MOONCAKE_BLOCK_TOKENS:
        out = list(chain.from_iterable(block_tokens(h) for h in ids[:num_blocks]))
    else:
        out = list(chain.from_iterable(block_tokens(h)[:size] for h in ids[:num_blocks]))
    del out[n:]
    return out
