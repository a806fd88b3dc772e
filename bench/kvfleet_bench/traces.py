"""The Mooncake conversation trace, turned into prompts a router can hash.

Each Mooncake `hash_id` stands for one 512-token block; equal ids mean a shared prefix.
Here each id expands deterministically into `block_chars` characters of pseudo-text
(the same id always gives the same text, different ids different text), so a prompt is
its ids' texts in order and prefix sharing in the trace becomes prefix sharing in bytes.
Arrival times are divided by `speedup` (time compression).

    python -m kvfleet_bench.traces --num-requests 2000 --speedup 11   # prints the subset's shape
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice
from pathlib import Path

from kvfleet_sim.trace import mooncake_rows

TRACE_PATH = (
    Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_conversation.jsonl"
)
WORDS = (
    "the a of to and in is it you that he was for on are with as his they be at one have this "
    "from or had by word but what some we can out other were all there when up use your how "
    "said an each she which do their time if will way about many then them write would like"
).split()


@dataclass(slots=True, frozen=True)
class TraceRequest:
    arrival_s: float  # after time compression, from the subset's first request
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]


def default_trace_path() -> Path:
    """shared/ sits beside the repository; in CI it is a copy in the same place."""
    return TRACE_PATH


@lru_cache(maxsize=65536)
def block_text(hash_id: int, block_chars: int) -> str:
    """Exactly `block_chars` characters, a pure function of (hash_id, block_chars)."""
    rng = random.Random(hash_id * 1_000_003 + block_chars)
    text = f"<{hash_id}>"
    parts = [text]
    size = len(text)
    while size < block_chars:
        word = " " + rng.choice(WORDS)
        parts.append(word)
        size += len(word)
    return "".join(parts)[:block_chars]


def prompt_text(hash_ids: tuple[int, ...] | list[int], block_chars: int) -> str:
    return "".join(block_text(h, block_chars) for h in hash_ids)


def load(
    path: Path | str, num_requests: int, speedup: float, skip: int = 0
) -> list[TraceRequest]:
    """The `num_requests` requests after the first `skip`, arrivals compressed by `speedup`.
    Rows are read and checked by the simulator's loader (`kvfleet_sim.trace`)."""
    if num_requests < 1 or speedup <= 0 or skip < 0:
        raise ValueError("num_requests and speedup must be positive, skip >= 0")
    rows = list(islice(mooncake_rows(path), skip, skip + num_requests))
    if not rows:
        raise ValueError(f"{path}: no requests after skipping {skip}")
    t0 = rows[0][1]
    return [
        TraceRequest((ts - t0) / 1000 / speedup, n_in, n_out, ids)
        for _, ts, n_in, n_out, ids in rows
    ]


def shape(requests: list[TraceRequest]) -> dict[str, float]:
    """Size of a subset, and the hit fraction an unbounded single cache would get."""
    seen: set[tuple[int, ...]] = set()
    num_blocks = num_reusable = 0
    for req in requests:
        for k in range(1, len(req.hash_ids) + 1):
            num_blocks += 1
            prefix = req.hash_ids[:k]
            if prefix in seen:
                num_reusable += 1
            else:
                seen.add(prefix)
    return {
        "num_requests": len(requests),
        "duration_s": requests[-1].arrival_s,
        "num_prompt_blocks": num_blocks,
        "num_distinct_prefix_blocks": len(seen),
        "unbounded_hit_fraction": num_reusable / num_blocks if num_blocks else 0.0,
        "mean_output_tokens": sum(r.output_length for r in requests) / len(requests),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--trace", default=str(default_trace_path()))
    p.add_argument("--num-requests", type=int, default=2000)
    p.add_argument("--speedup", type=float, default=11.0)
    p.add_argument("--skip", type=int, default=0)
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        requests = load(args.trace, args.num_requests, args.speedup, args.skip)
    except (OSError, ValueError, KeyError) as exc:
        print(f"traces: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(shape(requests), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
