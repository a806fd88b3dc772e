"""The online performance model: predicted TTFT and time per output token (TPOT) of one
request on one endpoint, learned from the fleet's own finished requests.

Pure: no I/O, no clock, no imports beyond the standard library (an import-linter
contract), so the operator's autoscaler asks the same model "how many replicas meet the
SLO" (`kvfleet_operator.decide.slo_sizing`; the one door the operator has into the router
besides its config schema).

Two small linear models, each fitted by exponentially forgotten ridge least squares on
relative error (each sample weighted 1 / y^2, `relative_weight`) over sufficient
statistics (`LinearStats`: X'X and X'y times `forget` before each sample, so old evidence
fades with a half-life of ln 2 / (1 - forget) samples):

* TTFT (s) = w . [1, u, u*w_q, w_q, r, kv]    u   = uncached prompt tokens / 1000
                                            w_q = requests queued ahead (not yet running)
                                            r   = requests running, kv = KV usage 0-1
  i.e. seconds per uncached token as a linear function of the queue (u*w_q), plus the
  queue's own wait, the running set's and the KV pressure's.
* TPOT (s) = v . [1, n, kv]                n   = requests in flight (the decode batch)

Per endpoint where the evidence suffices, per role otherwise: the role's model is the sum
of its endpoints' statistics (`LinearStats.merged`), so it needs no state of its own and
survives config pushes. Before an endpoint has `min_samples` answers the two predictions
are blended by its evidence (n / (n + min_samples / 4) on its own fit), so a replica's
own speed shows after a few answers; from then on its own fit is used only while it
predicts the endpoint's answers better than the pooled fit does (`FitErrors`: both
scored on each answer before it is learned). A slower replica keeps its own
coefficients; on replicas that are alike the pooled fit wins, and an endpoint whose own
fit came out fast by chance is not preferred for it (with own fits always, such an
endpoint drew the `latency` and `slo` policies to it).
Predictions are clamped to at least `floor_s`.

`OutputLengths` predicts a request's output tokens where the request does not bound it:
an EWMA per session, else per model, else a prior.

`Mape` tracks the predictor's mean absolute percentage error (the router's metric and
the simulator's report).

`RoleCoefficients` is a role's pooled fit as plain numbers (`role_coefficients`): what the
router exports as `kvfleet_router_perf_model_coefficient{role,target,feature}` and the
operator reads back (the simulator hands it over in process), so router and autoscaler
predict with one formula (`dot` over `ttft_features` / `tpot_features`). It carries the
role's recent uncached prompts too (`PROMPT_STATS`: each endpoint keeps its last
`PROMPT_WINDOW`), exported as `kvfleet_router_perf_model_prompt_ktokens{role,stat}`.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

TTFT_DIM = 6
TPOT_DIM = 3
# Feature names, in order (the exported gauges' `feature` label).
TTFT_FEATURES = ("const", "u", "u_wq", "wq", "r", "kv")
TPOT_FEATURES = ("const", "n", "kv")


# The role's recent uncached prompts (ktokens), as the numbers the router exports beside
# the weights: their mean, mean square and quantiles. A TTFT p90 is set by the long
# prompts (bench/slo_model_calibration.py), which a mean prompt does not show; the
# quantiles say how long, and the mean square how much prefill work they carry where
# prefill grows faster than the prompt (attention).
PROMPT_QUANTILES = (0.5, 0.75, 0.8, 0.85, 0.9, 0.92, 0.94, 0.95, 0.96, 0.97, 0.98, 0.99,
                    0.995)
PROMPT_STATS = ("mean", "mean_square", *(f"q{q:g}" for q in PROMPT_QUANTILES))
PROMPT_WINDOW = 128  # prompts kept per endpoint


def prompt_stats(ktokens: Iterable[float]) -> tuple[float, ...]:
    """`PROMPT_STATS` of some prompts (nearest-rank quantiles); () for none."""
    xs = sorted(ktokens)
    n = len(xs)
    if not n:
        return ()
    quantiles = (xs[min(n - 1, max(0, math.ceil(q * n) - 1))] for q in PROMPT_QUANTILES)
    return (sum(xs) / n, sum(x * x for x in xs) / n, *quantiles)


def ttft_features(uncached_tokens: float, num_waiting: float, num_running: float,
                  kv_usage: float) -> tuple[float, ...]:
    u = max(0.0, uncached_tokens) / 1000.0
    w = max(0.0, num_waiting)
    return (1.0, u, u * w, w, max(0.0, num_running), min(1.0, max(0.0, kv_usage)))


def tpot_features(num_in_flight: float, kv_usage: float) -> tuple[float, ...]:
    return (1.0, max(0.0, num_in_flight), min(1.0, max(0.0, kv_usage)))


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting on a small dense system. It runs twice
    per finished stream (the MAPE's prediction after each new sample), so the pivot search
    is a plain loop, not max() with a key function per element."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        piv, best = col, abs(m[col][col])
        for r in range(col + 1, n):
            v = abs(m[r][col])
            if v > best:  # the first of equal maxima, as max() would pick
                piv, best = r, v
        if best < 1e-18:
            return None
        top = m[piv]
        m[col], m[piv] = top, m[col]
        p = top[col]
        for r in range(col + 1, n):
            row = m[r]
            f = row[col] / p
            if f:
                for c in range(col, n + 1):
                    row[c] -= f * top[c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        row = m[r]
        acc = 0.0
        for c in range(r + 1, n):
            acc += row[c] * x[c]
        x[r] = (row[n] - acc) / row[r]
    return x


@dataclass(slots=True)
class LinearStats:
    """Forgetting least squares over sufficient statistics; `weights()` solves lazily."""

    dim: int
    forget: float = 0.995
    ridge: float = 1e-3
    xtx: list[list[float]] = field(default_factory=list)
    xty: list[float] = field(default_factory=list)
    num_samples: int = 0
    _weights: list[float] | None = None
    _fresh_weights: list[float] | None = None  # the last solve, kept across adds
    _solved_at: int = 0  # num_samples at that solve

    def __post_init__(self) -> None:
        if not self.xtx:
            self.xtx = [[0.0] * self.dim for _ in range(self.dim)]
            self.xty = [0.0] * self.dim

    def add(self, x: Sequence[float], y: float, weight: float = 1.0) -> None:
        lam = self.forget
        for i in range(self.dim):
            xi = x[i] * weight
            row = self.xtx[i]
            for j in range(self.dim):
                row[j] = lam * row[j] + xi * x[j]
            self.xty[i] = lam * self.xty[i] + xi * y
        self.num_samples += 1
        self._weights = None

    def weights(self) -> list[float] | None:
        if self.num_samples == 0:
            return None
        if self._weights is None:
            a = [row[:] for row in self.xtx]
            for i in range(self.dim):
                a[i][i] += self.ridge
            self._weights = self._fresh_weights = _solve(a, self.xty)
            self._solved_at = self.num_samples
        return self._weights

    def predict_recent(self, x: Sequence[float], max_age: int) -> float | None:
        """`predict` with the last fit while it is at most `max_age` samples old: for
        scoring the model (the MAPE), where a solve per finished request would cost more
        than all the rest of the learning."""
        w = self._fresh_weights
        if w is None or self.num_samples - self._solved_at > max_age:
            return self.predict(x)
        return sum(wi * xi for wi, xi in zip(w, x, strict=True))

    def predict(self, x: Sequence[float]) -> float | None:
        w = self.weights()
        if w is None:
            return None
        return sum(wi * xi for wi, xi in zip(w, x, strict=True))

    @classmethod
    def merged(cls, parts: Iterable[LinearStats], dim: int, forget: float,
               ridge: float) -> LinearStats:
        out = cls(dim, forget, ridge)
        for p in parts:
            if p.num_samples == 0:
                continue
            for i in range(dim):
                row, prow = out.xtx[i], p.xtx[i]
                for j in range(dim):
                    row[j] += prow[j]
                out.xty[i] += p.xty[i]
            out.num_samples += p.num_samples
        return out


@dataclass(slots=True)
class FitErrors:
    """How well the endpoint's own fit and the role's pooled fit predict the endpoint's
    answers: an EWMA of each one's relative error, both scored on the same answers (before
    each is learned), so the comparison is paired."""

    alpha: float = 0.05  # about the last 20 answers
    own: float | None = None
    pooled: float | None = None

    def add(self, own: float | None, pooled: float | None, actual: float) -> None:
        if own is None or pooled is None or actual <= 0:
            return
        self.own = self._step(self.own, abs(own - actual) / actual)
        self.pooled = self._step(self.pooled, abs(pooled - actual) / actual)

    def _step(self, old: float | None, error: float) -> float:
        # an EWMA written out: kvfleet_router.ewma is off limits here (standard library only)
        return error if old is None else self.alpha * error + (1 - self.alpha) * old

    @property
    def is_own_better(self) -> bool:
        """True once the own fit has predicted better; also while nothing compared them
        (no pooled fit was handed over: a router whose policies predict nothing)."""
        return self.own is None or self.pooled is None or self.own < self.pooled


@dataclass(slots=True)
class EndpointPerf:
    """One endpoint's learned TTFT and TPOT statistics (kept on its EndpointState), the
    role's pooled weights as last refitted (`RoleModel.refresh` hands them over) and how
    the two fits have predicted this endpoint's answers."""

    ttft: LinearStats = field(default_factory=lambda: LinearStats(TTFT_DIM))
    tpot: LinearStats = field(default_factory=lambda: LinearStats(TPOT_DIM))
    pooled_ttft: list[float] | None = None
    pooled_tpot: list[float] | None = None
    ttft_errors: FitErrors = field(default_factory=FitErrors)
    tpot_errors: FitErrors = field(default_factory=FitErrors)
    prompt_ktokens: deque[float] = field(default_factory=lambda: deque(maxlen=PROMPT_WINDOW))

    def learn_ttft(self, x: Sequence[float], ttft_s: float) -> None:
        _score(self.ttft, self.pooled_ttft, self.ttft_errors, x, ttft_s)
        self.ttft.add(x, ttft_s, relative_weight(ttft_s))
        self.prompt_ktokens.append(x[1])

    def learn_tpot(self, x: Sequence[float], tpot_s: float) -> None:
        _score(self.tpot, self.pooled_tpot, self.tpot_errors, x, tpot_s)
        self.tpot.add(x, tpot_s, relative_weight(tpot_s))


# A fit scored against an answer (here, and the MAPE in scorers_feedback) is at most this
# many samples old: a solve per answer would cost more than all the rest of the learning.
FIT_MAX_AGE = 8


def _score(own: LinearStats, pooled: list[float] | None, errors: FitErrors,
           x: Sequence[float], y: float) -> None:
    if pooled is None or own.num_samples == 0:
        return
    errors.add(own.predict_recent(x, FIT_MAX_AGE), dot(pooled, x), y)


def relative_weight(y: float, floor_s: float = 0.005) -> float:
    """1 / y^2 (y at least `floor_s`): least squares on relative error, so a 50 ms TTFT
    counts as much as a 5 s one (what the MAPE, and an SLO, care about)."""
    return 1.0 / max(floor_s, y) ** 2


@dataclass(slots=True)
class RoleModel:
    """The role's pooled model over its endpoints' statistics, refitted when stale."""

    min_samples: int = 32
    refit_every: int = 16
    forget: float = 0.995
    ridge: float = 1e-3
    floor_s: float = 1e-4
    _ttft: LinearStats | None = None
    _tpot: LinearStats | None = None
    _seen: int = -1

    def refresh(self, perfs: Sequence[EndpointPerf]) -> None:
        total = sum(p.ttft.num_samples + p.tpot.num_samples for p in perfs)
        if self._seen >= 0 and abs(total - self._seen) < self.refit_every:
            return
        self._seen = total
        self._ttft = LinearStats.merged((p.ttft for p in perfs), TTFT_DIM, self.forget,
                                        self.ridge)
        self._tpot = LinearStats.merged((p.tpot for p in perfs), TPOT_DIM, self.forget,
                                        self.ridge)
        # Each endpoint scores the pooled fit against its own answers; a pool of one
        # endpoint (a request allowed only one) is that endpoint's own fit: nothing to score.
        if sum(1 for p in perfs if p.ttft.num_samples or p.tpot.num_samples) >= 2:
            wt, wp = self._ttft.weights(), self._tpot.weights()
            for p in perfs:
                p.pooled_ttft, p.pooled_tpot = wt, wp

    def _predict(self, own: LinearStats, pooled: LinearStats | None, errors: FitErrors,
                 x: Sequence[float]) -> float | None:
        """Before `min_samples`: the endpoint's own fit and the role's pooled fit blended
        by evidence, n / (n + min_samples / 4) on its own. From then on its own fit while
        it has predicted this endpoint better (`FitErrors`), else the pooled fit."""
        n = own.num_samples
        # Both fits predict even where one is used: own.predict keeps the endpoint's last
        # solve fresh, which FitErrors and the MAPE score with (predict_recent); predicting
        # lazily changed the simulator's figures.
        mine = own.predict(x) if n else None
        theirs = pooled.predict(x) if pooled is not None and pooled.num_samples else None
        if theirs is None:
            y = mine
        elif n >= self.min_samples:
            y = mine if errors.is_own_better else theirs
        elif mine is None:
            y = theirs
        else:
            k = self.min_samples / 4
            y = (n * mine + k * theirs) / (n + k)
        return None if y is None else max(self.floor_s, y)

    def predict_ttft(self, perf: EndpointPerf, x: Sequence[float]) -> float | None:
        return self._predict(perf.ttft, self._ttft, perf.ttft_errors, x)

    def predict_tpot(self, perf: EndpointPerf, x: Sequence[float]) -> float | None:
        return self._predict(perf.tpot, self._tpot, perf.tpot_errors, x)


@dataclass(slots=True)
class OutputLengths:
    """Predicted output tokens: EWMA per session, else per model, else `prior`."""

    prior: float = 256.0
    alpha: float = 0.2
    max_keys: int = 10000
    by_session: dict[str, float] = field(default_factory=dict)
    by_model: dict[str, float] = field(default_factory=dict)

    def predict(self, model: str | None, session: str | None) -> float:
        if session and session in self.by_session:
            return self.by_session[session]
        return self.by_model.get(model or "", self.prior)

    def learn(self, model: str | None, session: str | None, num_tokens: float) -> None:
        for table, key in ((self.by_model, model or ""), (self.by_session, session)):
            if key is None:
                continue
            old = table.get(key)
            if old is None and len(table) >= self.max_keys:
                table.pop(next(iter(table)))  # oldest key first (insertion order)
            table[key] = num_tokens if old is None else (
                self.alpha * num_tokens + (1 - self.alpha) * old)


@dataclass(slots=True)
class Mape:
    """Mean absolute percentage error of predictions against what happened."""

    num_samples: int = 0
    sum_abs_pct: float = 0.0

    def add(self, predicted: float, actual: float) -> None:
        if actual <= 0:
            return
        self.num_samples += 1
        self.sum_abs_pct += abs(predicted - actual) / actual

    @property
    def value(self) -> float:
        return self.sum_abs_pct / self.num_samples if self.num_samples else 0.0


@dataclass(frozen=True, slots=True)
class RoleCoefficients:
    """One role's pooled model as numbers: TTFT weights over `TTFT_FEATURES`, TPOT weights
    over `TPOT_FEATURES`, how many finished requests each fit has seen, and the
    `PROMPT_STATS` of the role's recent uncached prompts (() when none were seen)."""

    ttft: tuple[float, ...]
    tpot: tuple[float, ...]
    num_ttft_samples: int = 0
    num_tpot_samples: int = 0
    prompt: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        if len(self.ttft) != TTFT_DIM or len(self.tpot) != TPOT_DIM:
            raise ValueError(f"need {TTFT_DIM} TTFT and {TPOT_DIM} TPOT coefficients, got "
                             f"{len(self.ttft)} and {len(self.tpot)}")
        if self.prompt and len(self.prompt) != len(PROMPT_STATS):
            raise ValueError(f"need {len(PROMPT_STATS)} prompt statistics, got "
                             f"{len(self.prompt)}")

    @property
    def mean_prompt_ktokens(self) -> float | None:
        """The role's recent mean uncached prompt (ktokens), None when unknown."""
        return self.prompt[PROMPT_STATS.index("mean")] if self.prompt else None

    def prompt_ktokens_at(self, q: float) -> float | None:
        """The role's q-quantile uncached prompt (ktokens), None when unknown. Between the
        exported quantiles interpolated; outside them, the nearest."""
        if not self.prompt:
            return None
        first = PROMPT_STATS.index(f"q{PROMPT_QUANTILES[0]:g}")
        points = list(zip(PROMPT_QUANTILES, self.prompt[first:], strict=True))
        if q <= points[0][0]:
            return points[0][1]
        for (q0, v0), (q1, v1) in zip(points, points[1:], strict=False):
            if q <= q1:
                return v0 + (v1 - v0) * (q - q0) / (q1 - q0)
        return points[-1][1]


def dot(weights: Sequence[float], x: Sequence[float]) -> float:
    return sum(w * xi for w, xi in zip(weights, x, strict=True))


def role_coefficients(perfs: Iterable[EndpointPerf], forget: float = 0.995,
                      ridge: float = 1e-3) -> RoleCoefficients | None:
    """The role's pooled fit over its endpoints' statistics (as `RoleModel` pools them),
    or None while neither model has a sample. A model without samples (a prefill role
    decodes nothing, so it never learns TPOT) has zero weights and zero evidence, and a
    reader takes that target from elsewhere (`slo_sizing.choose_coefficients`: the seed)."""
    perfs = list(perfs)
    ttft = LinearStats.merged((p.ttft for p in perfs), TTFT_DIM, forget, ridge)
    tpot = LinearStats.merged((p.tpot for p in perfs), TPOT_DIM, forget, ridge)
    wt, wp = ttft.weights(), tpot.weights()
    if wt is None and wp is None:
        return None
    return RoleCoefficients(tuple(wt or (0.0,) * TTFT_DIM), tuple(wp or (0.0,) * TPOT_DIM),
                            ttft.num_samples if wt else 0, tpot.num_samples if wp else 0,
                            prompt_stats(u for p in perfs for u in p.prompt_ktokens))
