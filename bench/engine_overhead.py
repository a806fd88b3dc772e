"""The engine's own cost per step (scheduling + bookkeeping) at batch 64 decode.

    .venv/bin/python bench/engine_overhead.py [--model tiny-random] [--steps 40]

Two figures from one run:
1. A zero-cost runner (returns a token at once): what the engine alone costs per step
   and per request, i.e. the ceiling on steps/s any runner could reach through it.
2. The torch runner on a real model: the engine's share of step time, from
   `LLMEngine.stats().timings` (schedule + postprocess vs runner.execute).
Ratios are what to quote; the machine is shared, so absolute times vary.
"""

from __future__ import annotations

import argparse
import sys
import time

from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.core.engine import LLMEngine
from kvfleet_engine.core.sampling_params import SamplingParams

BATCH = 64
PROMPT_LEN = 32


class ZeroCostRunner:
    """Computes nothing: every sequence that samples gets token 5 immediately."""

    block_size = 16
    num_blocks = 1024
    vocab_size = 260

    def execute(self, batch):
        return {s.request_id: 5 for s in batch.seqs if s.do_sample}

    def release(self, request_id):
        pass

    def kv_block_shape(self):
        return "uint64", [16]


def fill(engine: LLMEngine, max_tokens: int) -> None:
    for i in range(BATCH):
        prompt = [(i * 7 + j) % 250 for j in range(PROMPT_LEN)]
        engine.add_request(f"r{i}", prompt, SamplingParams(max_tokens=max_tokens,
                                                           temperature=0, ignore_eos=True))
    timings = engine.stats().timings
    while timings.last_num_seqs < BATCH or timings.last_num_tokens != BATCH:
        engine.step()  # until every request is decoding
        timings = engine.stats().timings


def measure(engine: LLMEngine, steps: int) -> tuple[float, float, float, float]:
    before = engine.stats().timings
    t0 = time.perf_counter()
    for _ in range(steps):
        engine.step()
    wall = time.perf_counter() - t0
    after = engine.stats().timings
    return (wall / steps, (after.schedule_s - before.schedule_s) / steps,
            (after.execute_s - before.execute_s) / steps,
            (after.postprocess_s - before.postprocess_s) / steps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args(argv)
    if args.steps < 1:
        print("engine_overhead: --steps must be at least 1", file=sys.stderr)
        return 2
    config = EngineConfig(num_blocks=1024, max_num_seqs=BATCH, max_num_batched_tokens=2048)
    engine = LLMEngine(config, ZeroCostRunner())
    fill(engine, max_tokens=args.steps * 10 + 20)
    wall, sched, _, post = measure(engine, args.steps * 10)
    print(f"zero-cost runner, batch {BATCH}: {wall * 1e6:.0f} us/step "
          f"({wall / BATCH * 1e6:.1f} us per request; schedule {sched * 1e6:.0f} us, "
          f"postprocess {post * 1e6:.0f} us)")

    from kvfleet_engine.llm import LLM

    llm = LLM(args.model, num_blocks=1024, max_num_seqs=BATCH, max_num_batched_tokens=2048)
    fill(llm.engine, max_tokens=args.steps + 20)
    wall, sched, exe, post = measure(llm.engine, args.steps)
    share = (sched + post) / (sched + exe + post)
    print(f"torch runner, {args.model}, batch {BATCH} decode: {wall * 1e3:.2f} ms/step; "
          f"schedule {sched * 1e3:.3f} ms + postprocess {post * 1e3:.3f} ms vs execute "
          f"{exe * 1e3:.2f} ms -> engine overhead {share:.1%} of step time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
