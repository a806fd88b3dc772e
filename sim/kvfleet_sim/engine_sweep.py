"""Offline engine measurements for the baselines that need a profile (`dynamo_planner.py`,
`llmd_keda.py`): the pool's own engine (the real `LLMEngine` over a `SimulatedRunner` on the
pool's cost profile, as `replica.py` builds it) run alone on a virtual clock with synthetic
requests, the way Dynamo's pre-deployment profiling sweep and llm-d's `calibrate.sh` measure
a GPU before deployment. Nothing is hand-set: every figure is a time the engine reported.

- `engine_config_for(spec)`: the pool's engine limits, prefix caching off (every prompt token
  is computed, so the figures are uncached throughput).
- `run_batch(spec, prompt_len, num_requests, num_output)`: start `num_requests` requests of
  distinct `prompt_len`-token prompts together at t = 0; returns each one's token times.
"""

from __future__ import annotations

from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.sampling_params import SamplingParams
from kvfleet_engine.runners.sim_runner import SimulatedRunner, VirtualClock
from kvfleet_operator.api.spec import PoolSpec

PROFILE_MODEL_LEN_DEFAULT = 8192  # the simulator's engine_config default for maxModelLen


def engine_config_for(spec: PoolSpec, num_gpu_blocks: int) -> EngineConfig:
    e = spec.engine
    return EngineConfig(
        num_blocks=e.num_blocks or num_gpu_blocks,
        block_size=e.block_size,
        max_num_seqs=e.max_num_seqs,
        max_num_batched_tokens=e.max_num_batched_tokens,
        max_model_len=e.max_model_len or PROFILE_MODEL_LEN_DEFAULT,
        enable_prefix_caching=False,
    )


def profile_name(spec: PoolSpec) -> str:
    e = spec.engine
    if e.kind != "builtin" or e.runner != "simulated" or not e.profile:
        raise ValueError("profiling needs engine.kind: builtin, runner: simulated and a profile")
    return e.profile


def run_batch(
    config: EngineConfig, profile: str, prompt_len: int, num_requests: int, num_output: int
) -> list[list[float]]:
    """Token times (seconds from t = 0) of each request, in request order."""
    if prompt_len < 1 or num_requests < 1 or num_output < 1:
        raise ValueError("need prompt_len, num_requests and num_output >= 1")
    clock = VirtualClock(0.0)
    runner = SimulatedRunner(profile, num_blocks=config.num_blocks, block_size=config.block_size,
                             time_mode="virtual", clock=clock, check_kv=False)  # fmt: skip
    engine = LLMEngine(config, runner, tokenizer=None, eos_token_ids=(), clock=clock)
    params = SamplingParams(max_tokens=num_output, temperature=0.0, ignore_eos=True)
    times: dict[str, list[float]] = {}
    for i in range(num_requests):
        rid = f"p{i}"
        # distinct tokens per request: no shared prefix, nothing cached
        prompt = [1 + (i * 7919 + j) % 30000 for j in range(prompt_len)]
        engine.add_request(rid, prompt, params, arrival_time=0.0)
        times[rid] = []
    num_done = 0
    for _ in range(1_000_000):
        for out in engine.step():
            if out.new_token_ids:
                times[out.request_id].append(clock.now_s)
            num_done += out.is_finished
        if num_done == num_requests:
            return [times[f"p{i}"] for i in range(num_requests)]
    raise RuntimeError("profiling run did not finish")  # pragma: no cover
