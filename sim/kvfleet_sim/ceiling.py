"""The SLO attainment no fleet can beat on a trace: requests whose prompt alone, on an idle
replica with an empty prefix cache, takes longer than the TTFT SLO to prefill.

On the Mooncake trace about 5% of prompts are long enough (over ~38k tokens on the
h100-llama3-8b profile) that no number of replicas meets a 2 s TTFT for them; a scaler's
attainment is then read against this ceiling, not against 100%.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvfleet_engine.core.runner_base import ScheduledSeq, StepBatch
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.runners.cost_model import CostProfile, step_time

from kvfleet_sim.trace import TraceRequest

_PARAMS = SamplingParams(max_tokens=1)


def solo_ttft_s(profile: CostProfile, num_prompt_tokens: int, chunk_tokens: int) -> float:
    """Seconds to the first token for one prompt alone: its prefill in chunks of at most
    `chunk_tokens` (the engine's token budget), each step costed by the cost model."""
    total, done = 0.0, 0
    while done < num_prompt_tokens:
        n = min(chunk_tokens, num_prompt_tokens - done)
        seq = ScheduledSeq("solo", [0] * n, done, [], done + n == num_prompt_tokens, _PARAMS)
        total += step_time(profile, StepBatch([seq]))
        done += n
    return total


def attainment_ceiling(trace: Sequence[TraceRequest], profile: CostProfile,
                       chunk_tokens: int, ttft_slo_s: float) -> float:  # fmt: skip
    """Fraction of `trace` whose solo TTFT is within the SLO (1.0 for an empty trace)."""
    if not trace:
        return 1.0
    met = sum(solo_ttft_s(profile, r.num_prompt_tokens, chunk_tokens) <= ttft_slo_s
              for r in trace)  # fmt: skip
    return met / len(trace)
