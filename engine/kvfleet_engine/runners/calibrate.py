"""Measure a real runner and fit a cost profile (`profiles/*.json`) to it.

    python -m kvfleet_engine.runners.calibrate --model tiny-random [--out profiles/cpu-tiny.json]

It times `runner.execute` on synthetic batches (decode at several batch sizes and
context lengths, prefill at several chunk sizes; fastest of a few repetitions) and fits
the cost model in cost_model.py by least squares. floor_s is 0: on CPU no memory-bound
floor shows apart from the fixed per-step cost, which the intercept captures.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any

from kvfleet_engine.core.runner_base import Runner, ScheduledSeq, StepBatch
from kvfleet_engine.core.sampling_params import SamplingParams

DECODE_BATCHES = (1, 8, 32, 64)
DECODE_CONTEXT = 32
KV_CONTEXTS = (32, 256, 1024)
KV_BATCH = 16
PREFILL_CHUNKS = (16, 128, 256, 512)
GREEDY = SamplingParams(max_tokens=1, temperature=0.0)


def linear_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs."""
    if len(xs) != len(ys) or len(xs) < 2:
        raise ValueError("linear_fit needs at least two (x, y) pairs")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    if sxx == 0:
        raise ValueError("linear_fit needs at least two distinct x values")
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return my - slope * mx, slope


def fit_two(xs: Sequence[float], zs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares (b, c) of ys ~ b*x + c*z, no intercept (normal equations)."""
    sxx = sum(x * x for x in xs)
    szz = sum(z * z for z in zs)
    sxz = sum(x * z for x, z in zip(xs, zs, strict=True))
    sxy = sum(x * y for x, y in zip(xs, ys, strict=True))
    szy = sum(z * y for z, y in zip(zs, ys, strict=True))
    det = sxx * szz - sxz * sxz
    if det == 0:
        raise ValueError("fit_two needs points that separate the two terms")
    return (sxy * szz - szy * sxz) / det, (szy * sxx - sxy * sxz) / det


def fit_profile(
    decode: dict[int, float], kv: dict[int, float], prefill: dict[int, float]
) -> dict[str, float]:
    """Cost-model parameters from timings.

    decode: batch size -> s (context DECODE_CONTEXT each); kv: context -> s (KV_BATCH
    decodes); prefill: chunk tokens -> s (one sequence from position 0).
    """
    _, kv_slope = linear_fit([c * KV_BATCH for c in kv], list(kv.values()))
    s_per_kv = max(kv_slope, 0.0)
    intercept, per_seq = linear_fit(list(decode), list(decode.values()))
    per_seq -= s_per_kv * (DECODE_CONTEXT + 1)  # the fit also paid each sequence's context
    overhead = max(intercept, 0.0)
    # prefill from position 0: t - overhead = (b + kv) * n + c * n(n+1)/2, fitted on
    # relative error (rows scaled by 1/t) so the longest chunk does not decide alone
    ns = list(prefill)
    per_prefill, per_pair = fit_two(
        [n / prefill[n] for n in ns],
        [n * (n + 1) / 2 / prefill[n] for n in ns],
        [(prefill[n] - overhead) / prefill[n] for n in ns],
    )
    per_prefill -= s_per_kv
    return {
        "overhead_s": overhead,
        "floor_s": 0.0,
        "prefill_s_per_token": max(per_prefill, 0.0),
        "decode_s_per_seq": max(per_seq, 0.0),
        "s_per_kv_token": s_per_kv,
        "prefill_s_per_pair": max(per_pair, 0.0),
    }


def _decode_batch(batch_size: int, context: int, block_size: int) -> StepBatch:
    per_seq = -(-(context + 1) // block_size)
    seqs = [
        ScheduledSeq(f"d{i}", [7], context, list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)),
                     True, GREEDY, num_output_tokens=1)
        for i in range(batch_size)
    ]
    return StepBatch(seqs)


def _prefill_batch(num_tokens: int, block_size: int) -> StepBatch:
    blocks = list(range(1, 1 + -(-num_tokens // block_size)))
    return StepBatch([ScheduledSeq("p", [i % 200 for i in range(num_tokens)], 0, blocks,
                                   True, GREEDY)])


def measure(runner: Runner, repeats: int = 9) -> dict[str, dict[int, float]]:
    """Fastest time of each synthetic batch. Rounds interleave all batches, so a busy
    spell on the (shared) machine hits every point alike instead of skewing one."""
    bs = runner.block_size
    batches = {
        "decode": {b: _decode_batch(b, DECODE_CONTEXT, bs) for b in DECODE_BATCHES},
        "kv": {c: _decode_batch(KV_BATCH, c, bs) for c in KV_CONTEXTS},
        "prefill": {n: _prefill_batch(n, bs) for n in PREFILL_CHUNKS},
    }
    best = {kind: dict.fromkeys(points, float("inf")) for kind, points in batches.items()}
    for round_ in range(repeats + 1):
        for kind, points in batches.items():
            for key, batch in points.items():
                t0 = time.perf_counter()
                runner.execute(batch)
                elapsed = time.perf_counter() - t0
                if round_ > 0:  # round 0 warms up
                    best[kind][key] = min(best[kind][key], elapsed)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvfleet_engine.runners.calibrate")
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--name", default="cpu-tiny")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", help="write the profile JSON here (default: stdout)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        print("calibrate: --repeats must be at least 1", file=sys.stderr)
        return 2
    import torch

    from kvfleet_engine.model import registry
    from kvfleet_engine.runners.torch_runner import TorchRunner

    try:
        loaded = registry.load(args.model, dtype=args.dtype)
    except ValueError as exc:
        print(f"calibrate: {exc}", file=sys.stderr)
        return 2
    block_size = 16
    num_blocks = 1 + max(KV_BATCH * -(-(max(KV_CONTEXTS) + 1) // block_size),
                         max(DECODE_BATCHES) * -(-(DECODE_CONTEXT + 1) // block_size))
    runner = TorchRunner(loaded.model, num_blocks, block_size, seed=0)
    timings = measure(runner, args.repeats)
    profile: dict[str, Any] = {"name": args.name, **fit_profile(**timings),
                               "num_gpu_blocks": 1024, "block_size": block_size,
                               "vocab_size": loaded.config.vocab_size,
                               "model": {"name": args.model,
                                         "num_layers": loaded.config.num_layers,
                                         "num_kv_heads": loaded.config.num_kv_heads,
                                         "head_dim": loaded.config.head_dim,
                                         "dtype_bytes": torch.finfo(loaded.model.dtype).bits // 8}}
    profile["source"] = (
        f"Measured on this machine ({platform.machine()}, {torch.get_num_threads()} torch "
        f"threads, torch {torch.__version__}) with `python -m kvfleet_engine.runners.calibrate "
        f"--model {args.model} --repeats {args.repeats}` on {time.strftime('%Y-%m-%d')}: "
        "TorchRunner.execute timed on synthetic batches, least-squares fit."
    )
    profile["notes"] = {kind: {str(k): round(v, 6) for k, v in values.items()}
                        for kind, values in timings.items()}
    text = json.dumps(profile, indent=2) + "\n"
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
