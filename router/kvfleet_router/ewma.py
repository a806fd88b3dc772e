"""An exponentially weighted moving average that knows whether it has seen a sample."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class Ewma:
    alpha: float = 0.2
    value: float | None = None
    num_samples: int = 0

    def add(self, sample: float) -> None:
        self.num_samples += 1
        self.value = sample if self.value is None else (
            self.alpha * sample + (1 - self.alpha) * self.value)
