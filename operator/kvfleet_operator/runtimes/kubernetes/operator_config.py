"""What `kvfleet operator run` passes to every pool's reconcile and control loop."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvfleet_operator.runtimes.kubernetes.build.options import KVFLEET_IMAGE, BuildOptions


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    """- `image`: kvfleet's image (routers, builtin engines).
    - `max_tick_s`: the loop ticks every `min(autoscaling.intervalSeconds, max_tick_s)`
      (drains are checked every tick; the scaler decides every `intervalSeconds`).
    - `retry_delay_s`: how long kopf waits before re-running a reconcile that hit an API
      error (an invalid spec is never retried until the spec changes).
    - `prometheus_url`: read engine metrics from this Prometheus instead of scraping pods.
    - `metrics_port`: serve the operator's own `/metrics` (every pool's loop series) here,
      on all addresses; None: not served.
    """

    image: str = KVFLEET_IMAGE
    options: BuildOptions = field(default_factory=BuildOptions)
    max_tick_s: float = 5.0
    retry_delay_s: float = 10.0
    prometheus_url: str | None = None
    metrics_port: int | None = None

    def __post_init__(self) -> None:
        if self.max_tick_s <= 0 or self.retry_delay_s <= 0:
            raise ValueError("max_tick_s and retry_delay_s must be > 0")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ValueError(f"metrics_port {self.metrics_port} is out of range")
