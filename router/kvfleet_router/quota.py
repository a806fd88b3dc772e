"""Per-tenant rate limits: requests and tokens per minute, as token buckets (pure; the
caller passes the time).

    book = QuotaBook(cfg.quotas)
    verdict = book.admit("team-a", tokens=1200, now=time.monotonic())
    if not verdict.is_admitted: answer 429 (verdict.limit_name says which limit)
    ...                                   # when the answer ends:
    book.settle("team-a", charged=1200, actual=830, now=time.monotonic())

Each limited tenant has one bucket per limit (RPM counts requests, TPM counts tokens).
A bucket holds at most `burst` units and refills continuously at limit/60 per second, so a
flood is admitted at exactly the limit; `burst` is `burst_s` seconds of the limit (at least
one request), the short burst OpenAI also allows ("60,000 RPM may be enforced as 1,000
requests per second"). Any 60 s window therefore admits at most limit × (1 + burst_s/60)
plus one request's overshoot (below).

Tokens are charged at admission: the prompt estimate plus max_tokens (× n), as OpenAI
counts max_tokens against TPM up front. When the answer ends, `settle` reconciles with the
actual usage: unused tokens go back into the bucket (never above `burst`), extra ones are
taken (the bucket may go below zero, and the debt delays the tenant's next requests). A
request costing more than the bucket holds passes only on a full bucket and leaves debt; one
costing more than the whole TPM limit can never pass and is refused as too large, as OpenAI
refuses it.

A request is admitted only if every limit of its tenant admits it, and then charged on all
of them; a refusal charges nothing. Buckets of tenants without limits are never made, and a
full bucket is the same as no bucket, so full ones are dropped once the table reaches
`max_tenants` (`quotas.max_tracked_tenants`); if more than three quarters of it are still
left, only the three quarters with the least left in them are kept (a forgotten bucket
comes back full, so forgetting the fullest gives away the least). Tenant names chosen by
clients therefore cannot grow memory without bound, and pruning to three quarters keeps
its cost amortised O(log n) per new tenant.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from kvfleet_router.config import QuotasConfig, TenantQuota

REQUESTS, TOKENS = "requests", "tokens"
_EPS = 1e-9


@dataclass(slots=True)
class TokenBucket:
    """`level` units available at `updated_s`, refilled at `per_min`/60 per second up to
    `burst`. The level may be negative (debt from a settled answer that used more)."""

    per_min: float
    burst: float
    level: float
    updated_s: float

    @classmethod
    def full(cls, per_min: float, burst: float, now: float) -> TokenBucket:
        return cls(per_min, burst, burst, now)

    def refill(self, now: float) -> None:
        if now > self.updated_s:
            self.level = min(self.burst, self.level + (now - self.updated_s) * self.per_min / 60)
            self.updated_s = now

    def needed(self, amount: float) -> float:
        """The level at which `amount` may be taken: all of it, or a full bucket."""
        return min(amount, self.burst)

    def can_take(self, amount: float, now: float) -> bool:
        self.refill(now)
        return self.level >= self.needed(amount) - _EPS

    def take(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level -= amount

    def give(self, amount: float, now: float) -> None:
        self.refill(now)
        self.level = min(self.burst, self.level + amount)

    def wait_s(self, amount: float, now: float) -> float:
        """Seconds until `amount` may be taken (0 when it may now)."""
        self.refill(now)
        return max(0.0, self.needed(amount) - self.level) * 60 / self.per_min

    def full_in_s(self, now: float) -> float:
        """Seconds until the bucket is full again (OpenAI's `x-ratelimit-reset-*`)."""
        self.refill(now)
        return max(0.0, self.burst - self.level) * 60 / self.per_min

    def remaining(self, now: float) -> int:
        self.refill(now)
        return max(0, math.floor(self.level + _EPS))

    def is_full(self, now: float) -> bool:
        self.refill(now)
        return self.level >= self.burst - _EPS


@dataclass(frozen=True, slots=True)
class LimitState:
    """One limit as OpenAI's headers show it: `x-ratelimit-{limit,remaining,reset}-<name>`."""

    name: str  # REQUESTS | TOKENS
    limit: int  # per minute
    remaining: int
    reset_s: float  # until the bucket is full again


@dataclass(frozen=True, slots=True)
class Verdict:
    is_admitted: bool
    states: tuple[LimitState, ...] = ()  # the tenant's limits (empty: none apply)
    limit_name: str | None = None  # the limit that refused
    requested: int = 0  # what the refusing limit was asked for
    retry_after_s: float = 0.0  # when it could pass (0 with is_too_large)
    is_too_large: bool = False  # more tokens than the whole TPM limit: never passes


def bucket_depth(per_min: int, burst_s: float, is_requests: bool) -> float:
    """`burst_s` seconds of the limit, and at least one request for an RPM bucket."""
    depth = per_min * burst_s / 60
    return max(depth, 1.0) if is_requests else max(depth, _EPS)


class QuotaBook:
    """The buckets of every limited tenant, following config reloads (`configure`)."""

    def __init__(self, cfg: QuotasConfig, max_tenants: int | None = None) -> None:
        """`max_tenants`: the bucket cap, else `cfg.max_tracked_tenants` (and its pushes)."""
        self._max_tenants = max_tenants
        self._buckets: dict[tuple[str, str], TokenBucket] = {}
        self.configure(cfg)

    def configure(self, cfg: QuotasConfig) -> None:
        """New limits apply at once; a bucket keeps its level (cut to its new depth), and a
        tenant whose limit went away loses its bucket."""
        self.cfg = cfg
        self.max_tenants = self._max_tenants or cfg.max_tracked_tenants
        for (tenant, name), bucket in list(self._buckets.items()):
            per_min = self._per_min(tenant, name)
            if per_min == 0:
                del self._buckets[tenant, name]
                continue
            bucket.per_min = per_min
            bucket.burst = bucket_depth(per_min, cfg.burst_s, name == REQUESTS)
            bucket.level = min(bucket.level, bucket.burst)

    def limits(self, tenant: str) -> TenantQuota:
        return self.cfg.tenants.get(tenant, self.cfg.default)

    def is_limited(self, tenant: str) -> bool:
        q = self.limits(tenant)
        return q.rpm > 0 or q.tpm > 0

    def _per_min(self, tenant: str, name: str) -> int:
        q = self.limits(tenant)
        return q.rpm if name == REQUESTS else q.tpm

    def _bucket(self, tenant: str, name: str, now: float) -> TokenBucket | None:
        per_min = self._per_min(tenant, name)
        if per_min == 0:
            return None
        bucket = self._buckets.get((tenant, name))
        if bucket is None:
            if len(self._buckets) >= self.max_tenants:
                self._shrink(now)
            bucket = TokenBucket.full(per_min, bucket_depth(
                per_min, self.cfg.burst_s, name == REQUESTS), now)
            self._buckets[tenant, name] = bucket
        return bucket

    def _shrink(self, now: float) -> None:
        """Drop the full buckets, then all but the 3/4 cap with the least left in them."""
        kept = {key: b for key, b in self._buckets.items() if not b.is_full(now)}
        low_water = max(1, self.max_tenants * 3 // 4)
        if len(kept) > low_water:
            emptiest = heapq.nsmallest(low_water, kept, key=lambda k: kept[k].level / kept[k].burst)
            kept = {key: kept[key] for key in emptiest}
        self._buckets = kept

    def __len__(self) -> int:
        return len(self._buckets)

    def _states(self, tenant: str, now: float) -> tuple[LimitState, ...]:
        out = []
        for name in (REQUESTS, TOKENS):
            bucket = self._bucket(tenant, name, now)
            if bucket is not None:
                out.append(LimitState(name, int(bucket.per_min), bucket.remaining(now),
                                      bucket.full_in_s(now)))
        return tuple(out)

    def admit(self, tenant: str, tokens: int, now: float) -> Verdict:
        """Charge one request of `tokens` tokens, or refuse it and charge nothing."""
        asks = ((REQUESTS, 1), (TOKENS, tokens))
        buckets = [(name, amount, self._bucket(tenant, name, now)) for name, amount in asks]
        for name, amount, bucket in buckets:
            if bucket is None:
                continue
            if name == TOKENS and amount > bucket.per_min:
                return Verdict(False, self._states(tenant, now), name, amount,
                               is_too_large=True)
            if not bucket.can_take(amount, now):
                return Verdict(False, self._states(tenant, now), name, amount,
                               bucket.wait_s(amount, now))
        for _, amount, bucket in buckets:
            if bucket is not None:
                bucket.take(amount, now)
        return Verdict(True, self._states(tenant, now))

    def settle(self, tenant: str, charged: int, actual: int, now: float) -> None:
        """Reconcile the tokens charged at admission with what the answer used."""
        bucket = self._bucket(tenant, TOKENS, now)
        if bucket is None or charged == actual:
            return
        if actual < charged:
            bucket.give(charged - actual, now)
        else:
            bucket.take(actual - charged, now)


def duration_text(seconds: float) -> str:
    """A duration as OpenAI's reset headers write it (Go's style): 0s, 17ms, 1.5s, 6m0s."""
    ms = math.ceil(seconds * 1000 - 1e-6)
    if ms <= 0:
        return "0s"
    if ms < 1000:
        return f"{ms}ms"
    minutes, rest = divmod(ms, 60_000)
    secs = f"{rest / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"
