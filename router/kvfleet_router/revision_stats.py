"""What a router measured per engine revision, for a rollout's analysis; pure.

A router counts, for each revision its endpoints carry, the upstream attempts that ended
well or in an error, and histograms of time to first token and of the gaps between
streamed chunks (inter-token latency). Counters only grow while the router runs; the
operator combines every router replica's counters (`+`), takes the difference from the
counters it saw when a rollout step began (`since`, which treats a counter that went
backwards as a router restart) and reads an error rate and p90s from that window.

`RevisionCounts.to_dict()` is the shape `GET /admin/config` answers under `revisions`.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

# Upper bounds (seconds) of the latency histograms' buckets; one more bucket is +Inf.
LATENCY_BUCKETS_S: tuple[float, ...] = (
    0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0,
    3.0, 5.0, 7.5, 10.0, 20.0, 60.0,
)
NUM_BUCKETS = len(LATENCY_BUCKETS_S) + 1


def _zeros() -> list[int]:
    return [0] * NUM_BUCKETS


def bucket_of(seconds: float) -> int:
    """The bucket a latency falls in (its upper bound is the first >= it)."""
    return bisect.bisect_left(LATENCY_BUCKETS_S, seconds)


def quantile(counts: list[int], q: float) -> float | None:
    """The q-quantile of a bucketed histogram, interpolated linearly inside its bucket (as
    Prometheus' histogram_quantile does); None when empty. The +Inf bucket answers its lower
    bound."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            lower = LATENCY_BUCKETS_S[i - 1] if i > 0 else 0.0
            if i >= len(LATENCY_BUCKETS_S):
                return lower
            upper = LATENCY_BUCKETS_S[i]
            return lower + (upper - lower) * max(0.0, rank - seen) / n
        seen += n
    return LATENCY_BUCKETS_S[-1]


@dataclass(slots=True)
class RevisionCounts:
    requests: int = 0  # upstream attempts on endpoints of this revision that finished
    errors: int = 0  # of those: a 5xx, a refused or dropped connection, a broken stream
    ttft: list[int] = field(default_factory=_zeros)  # per-bucket counts (not cumulative)
    itl: list[int] = field(default_factory=_zeros)

    def record(self, *, is_error: bool) -> None:
        self.requests += 1
        self.errors += int(is_error)

    def observe_ttft(self, seconds: float) -> None:
        self.ttft[bucket_of(seconds)] += 1

    def observe_itl(self, seconds: float) -> None:
        self.itl[bucket_of(seconds)] += 1

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.requests if self.requests else None

    def ttft_p90(self) -> float | None:
        return quantile(self.ttft, 0.9)

    def itl_p90(self) -> float | None:
        return quantile(self.itl, 0.9)

    def __add__(self, other: RevisionCounts) -> RevisionCounts:
        return RevisionCounts(
            self.requests + other.requests, self.errors + other.errors,
            [a + b for a, b in zip(self.ttft, other.ttft, strict=True)],
            [a + b for a, b in zip(self.itl, other.itl, strict=True)],
        )

    def copy(self) -> RevisionCounts:
        return RevisionCounts(self.requests, self.errors, list(self.ttft), list(self.itl))

    def since(self, earlier: RevisionCounts | None) -> RevisionCounts:
        """What was counted after `earlier`; everything when a counter went backwards (a
        router restarted and counts from zero again)."""
        if earlier is None or self.requests < earlier.requests or self.errors < earlier.errors \
                or any(a < b for a, b in zip(self.ttft + self.itl, earlier.ttft + earlier.itl,
                                            strict=True)):  # fmt: skip
            return self.copy()
        return RevisionCounts(
            self.requests - earlier.requests, self.errors - earlier.errors,
            [a - b for a, b in zip(self.ttft, earlier.ttft, strict=True)],
            [a - b for a, b in zip(self.itl, earlier.itl, strict=True)],
        )

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "errors": self.errors,
                "ttft": list(self.ttft), "itl": list(self.itl)}

    @classmethod
    def from_dict(cls, data: Any) -> RevisionCounts:
        """Read `to_dict` output; raises ValueError naming what is malformed."""
        if not isinstance(data, dict):
            raise ValueError("revision counts must be an object")
        out = cls(_count(data.get("requests", 0)), _count(data.get("errors", 0)),
                  _buckets(data.get("ttft")), _buckets(data.get("itl")))
        if out.errors > out.requests:
            raise ValueError(f"errors ({out.errors}) exceed requests ({out.requests})")
        return out


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"a count must be a non-negative integer, got {value!r}")
    return value


def _buckets(value: Any) -> list[int]:
    if value is None:
        return _zeros()
    if not isinstance(value, list) or len(value) != NUM_BUCKETS:
        raise ValueError(f"a histogram must list {NUM_BUCKETS} bucket counts")
    return [_count(v) for v in value]


def combine(many: list[dict[str, RevisionCounts]]) -> dict[str, RevisionCounts]:
    """Several routers' counters, summed per revision."""
    out: dict[str, RevisionCounts] = {}
    for one in many:
        for revision, counts in one.items():
            out[revision] = out[revision] + counts if revision in out else counts.copy()
    return out
