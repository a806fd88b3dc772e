"""One backend as the router sees it: its config, live counters, scraped signals, health.

Policies read these objects and nothing else, so a benchmark or simulator can build them
directly (`EndpointState.from_config(EndpointConfig(...))`) without any I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvfleet_router.breaker import CircuitBreaker
from kvfleet_router.config import EndpointConfig, HealthConfig
from kvfleet_router.ewma import Ewma
from kvfleet_router.peer_measure import PeerMeasure, PeerTotals
from kvfleet_router.perf_model import EndpointPerf, Mape, OutputLengths

__all__ = ["EndpointState", "Ewma", "Signals"]


@dataclass(slots=True)
class Signals:
    """The last /metrics scrape. `scraped_at` 0 means never; stale means unknown."""

    num_running: float = 0.0
    num_waiting: float = 0.0
    kv_usage: float = 0.0  # 0-1
    block_size: int = 0
    num_gpu_blocks: int = 0  # its KV capacity in blocks; 0: not exported
    is_draining: bool = False  # the engine says it is draining (kvfleet:draining, SIGTERM)
    scraped_at: float = 0.0
    peer: PeerTotals | None = None  # peer-prefix counters (kvfleet engines that expose them)

    def is_fresh(self, now: float, stale_after_s: float) -> bool:
        return self.scraped_at > 0 and now - self.scraped_at <= stale_after_s


@dataclass(slots=True)
class EndpointState:
    name: str
    url: str
    role: str = "unified"
    is_draining: bool = False
    capacity: int = 256
    models: tuple[str, ...] = ()
    prefix_mode: str = "approximate"
    engine: str = "unknown"  # builtin | vllm | unknown: only builtin ones take peer hints
    revision: str = ""  # the engine revision it runs (revisions.py); "" none
    num_in_flight: int = 0  # this router process's own requests there
    # those of them that have not answered a first byte yet: queued in the engine or in
    # their prefill, what a new request's TTFT waits behind (the `pending` scorer)
    num_pending: int = 0
    # their uncached prompt tokens, as the router estimated them when it sent each one
    # (the `backlog` scorer)
    pending_tokens: float = 0.0
    peer_in_flight: float = 0.0  # the pool's other router replicas' (exchange.py), fresh ones
    is_probe_healthy: bool = True  # last active /health probe
    is_removed: bool = False  # dropped from config; kept until its in-flight requests end
    signals: Signals = field(default_factory=Signals)
    is_signals_fresh: bool = False  # refreshed by the poller; stale => unknown, not idle
    foreign_load: float = 0.0  # engine running+waiting beyond our in-flight at the last scrape
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    ttft: Ewma = field(default_factory=Ewma)  # seconds to first byte
    prefill_s_per_token: Ewma = field(default_factory=Ewma)  # alpha of the SLO scorer
    decode_s_per_token: Ewma = field(default_factory=Ewma)  # beta of the SLO scorer
    num_ucb_pulls: int = 0
    ucb_reward_sum: float = 0.0
    peer_measure: PeerMeasure = field(default_factory=PeerMeasure)  # peer_measure.py
    # perf_model.py: the endpoint's learned TTFT/TPOT statistics, its output lengths per
    # model and session, and the error of what was predicted for it (the router's metric)
    perf: EndpointPerf = field(default_factory=EndpointPerf)
    output_lengths: OutputLengths = field(default_factory=OutputLengths)
    ttft_mape: Mape = field(default_factory=Mape)
    tpot_mape: Mape = field(default_factory=Mape)

    @classmethod
    def from_config(cls, cfg: EndpointConfig, health: HealthConfig | None = None,
                    ewma_alpha: float = 0.2, forget: float = 0.995) -> EndpointState:
        h = health or HealthConfig()
        state = cls(name=cfg.name, url=cfg.url)
        state.apply_config(cfg)
        state.breaker = CircuitBreaker(h.eject_after_errors, h.eject_base_s, h.eject_max_s)
        state.apply_learning(ewma_alpha, forget)
        return state

    def apply_learning(self, ewma_alpha: float, forget: float) -> None:
        """policy.slo's learning rates, in place: what was learned stays, and from now on
        it fades at the new rate."""
        for ewma in (self.ttft, self.prefill_s_per_token, self.decode_s_per_token):
            ewma.alpha = ewma_alpha
        self.perf.ttft.forget = self.perf.tpot.forget = forget

    def apply_config(self, cfg: EndpointConfig) -> None:
        """Update the mutable settings in place; in-flight counters and history stay."""
        self.role = cfg.role
        self.is_draining = cfg.is_draining
        self.capacity = cfg.capacity
        self.models = tuple(cfg.models)
        self.prefix_mode = cfg.prefix_mode
        self.engine = cfg.engine
        self.revision = cfg.revision

    @property
    def in_flight_total(self) -> float:
        """In flight from every router replica of the pool: this one's exact count plus what
        the others last reported (exchange.py; 0 without an exchange)."""
        return self.num_in_flight + self.peer_in_flight

    @property
    def load(self) -> float:
        """in-flight / capacity, the load used by the imbalance metric."""
        return self.in_flight_total / self.capacity

    def apply_scrape(self, signals: Signals) -> None:
        """Take a new /metrics scrape; its freshness is judged later against `now`."""
        self.signals = signals
        if signals.peer is not None:
            self.peer_measure.observe(signals.peer)
        # The engine's load beyond our own in-flight requests: other routers' share.
        self.foreign_load = max(0.0, signals.num_running + signals.num_waiting
                                - self.in_flight_total)

    def queue_depth(self) -> float:
        """Requests ahead of a new one: the router's own (exact, live) in-flight count plus
        the load it cannot see (other clients' requests, from the last fresh scrape).

        Taking the engine's whole count instead would keep a backend that has already
        drained looking busy until the next poll, herding work elsewhere and back."""
        if self.is_signals_fresh:
            return self.in_flight_total + self.foreign_load
        return self.in_flight_total

    def kv_usage(self) -> float | None:
        """KV occupancy 0-1, or None when unknown (never scraped or stale)."""
        return self.signals.kv_usage if self.is_signals_fresh else None

    def is_accepting(self) -> bool:
        """Neither draining by config nor, per a fresh scrape, by its own account."""
        return not (self.is_draining or self.is_removed or
                    (self.is_signals_fresh and self.signals.is_draining))

    def is_healthy(self, now: float) -> bool:
        return self.is_probe_healthy and self.breaker.can_attempt(now)

    def state_name(self) -> str:
        if self.is_removed:
            return "removed"
        return "draining" if self.is_draining else "active"
