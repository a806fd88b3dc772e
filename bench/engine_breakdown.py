"""Where an engine run's time goes: per-op wall time, split into prefill and decode steps.

Runs one load of engine_throughput.py's (kvfleet_bench.workloads: same prompts, same engine
settings) with a timer around each op of the decoder (`kvfleet_engine.model.ops`, paged
attention, the logits GEMM). "other" is the step time no timer covers: scheduling, batch
prep, sampling, Python.

    .venv/bin/python bench/engine_breakdown.py --model smollm2-135m --workload mixed
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from collections.abc import Callable
from typing import Any

from kvfleet_bench.workloads import AZURE_TRACE as TRACE
from kvfleet_bench.workloads import random_prompts, sized_engine, trace_lengths

Timers = collections.defaultdict[str, float]


def timed(owner: Any, name: str, label: str, timers: Timers) -> None:
    """Wrap owner.name so each call adds its wall time to timers[label]."""
    fn: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            timers[label] += time.perf_counter() - t0

    setattr(owner, name, wrapper)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--workload", choices=["mixed", "fixed"], default="mixed")
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--batched-tokens", type=int, default=1024)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args(argv)
    if args.workload == "mixed" and not TRACE.is_file():
        print(f"engine_breakdown: trace not found: {TRACE}", file=sys.stderr)
        return 2
    import torch
    from kvfleet_engine.core.sampling_params import SamplingParams
    from kvfleet_engine.model import llama, ops, paged_attention
    from kvfleet_engine.model.registry import load

    torch.set_num_threads(args.threads)
    timers: Timers = collections.defaultdict(float)
    # compute_logits calls ops.linear: wrap it first, so the layer GEMMs exclude the head.
    timed(llama.LlamaModel, "compute_logits", "logits", timers)
    for name in ("linear", "rms_norm", "silu_mul", "rotate"):
        timed(ops, name, name, timers)
    timed(paged_attention.PagedAttention, "__call__", "attention", timers)

    loaded = load(args.model, dtype="float32" if args.model == "tiny-random" else "bfloat16")
    vocab = loaded.config.vocab_size
    if args.workload == "mixed":
        items = random_prompts(trace_lengths(TRACE, args.num_requests, 0), vocab, 1)
    else:
        items = random_prompts([(128, 128)] * args.num_requests, vocab, 2)
    engine, _ = sized_engine(loaded.model, items, 256, args.batched_tokens)
    for i, (prompt, n) in enumerate(items):
        engine.add_request(str(i), prompt, SamplingParams(max_tokens=n, temperature=0,
                                                          ignore_eos=True))
    phases: dict[str, Timers] = {}
    wall0 = time.perf_counter()
    while engine.has_unfinished_requests():
        before = dict(timers)
        t0 = time.perf_counter()
        engine.step()
        spent = time.perf_counter() - t0
        t = engine.stats().timings
        phase = phases.setdefault(
            "decode" if t.last_num_tokens == t.last_num_seqs else "prefill",
            collections.defaultdict(float))
        phase["steps"] += 1
        phase["step time"] += spent
        for label, total in timers.items():
            phase[label] += total - before.get(label, 0.0)
    wall = time.perf_counter() - wall0
    print(f"{args.model}, {args.workload} load: {wall:.2f} s")
    for name, phase in phases.items():
        steps, step_time = int(phase.pop("steps")), phase.pop("step time")
        logits = phase.get("logits", 0.0)
        layers = dict(phase)
        layers["linear"] = layers.get("linear", 0.0) - logits  # logits' GEMM counted once
        other = step_time - sum(layers.values())
        parts = sorted(layers.items(), key=lambda kv: -kv[1]) + [("other", other)]
        shares = ", ".join(f"{k} {v:.2f} s ({100 * v / step_time:.0f}%)" for k, v in parts)
        print(f"  {name}: {steps} steps, {step_time:.2f} s: {shares}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
