"""The CPU kernels one at a time, against the plain-torch path they replace.

On SmolLM2-135M's shapes (hidden 576, MLP 1536, 9 query / 3 KV heads of 64, 30 layers),
with random bf16 data and a distinct weight per layer so that weights come from DRAM as in
a real step:
- GEMM: the kernel over pair-packed weights vs F.linear, for several row counts;
- decode attention: 64 sequences of 192 tokens, every layer, kernel vs torch path
  (gather + SDPA), with the KV bytes read per second;
- prefill attention: 2 prompts of 512 tokens, one layer, in causal GFLOP/s;
- build_step_meta for a batch-64 decode step.
Fastest of --repeats runs; both sides in the same process, back to back.

    .venv/bin/python bench/engine_kernels.py
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from kvfleet_engine.model import ops
from kvfleet_engine.model.paged_attention import PagedAttention, PagedKVCache, build_step_meta
from kvfleet_engine.model.tiny import tiny_config

HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 576, 1536, 9, 3, 64
LINEARS = {"qkv": (HIDDEN + 2 * KV_HEADS * HEAD_DIM, HIDDEN), "o": (HIDDEN, HIDDEN),
           "gate_up": (2 * INTER, HIDDEN), "down": (HIDDEN, INTER)}


def fastest(fn: Callable[[], object], repeats: int) -> float:
    fn()  # first-call costs stay out
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def torch_path(fn: Callable[[], object]) -> Callable[[], object]:
    def run() -> object:
        ops.use_kernels(False)
        try:
            return fn()
        finally:
            ops.use_kernels(True)
    return run


def run_linears(calls: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
                is_kernel: bool) -> None:
    for x, w, packed in calls:
        if is_kernel:
            ops.linear(x, w, packed=packed)
        else:
            F.linear(x, w)


def bench_gemm(rows: list[int], layers: int, repeats: int) -> None:
    weights = {k: [torch.randn(n, k_in).bfloat16() for _ in range(layers)]
               for k, (n, k_in) in LINEARS.items()}
    packed = {k: [ops.PackedWeight().get(w) for w in ws] for k, ws in weights.items()}
    print(f"GEMM, {layers} layers of SmolLM2 linears (ms per step, GFLOP/s):")
    for m in rows:
        xs = {k_in: torch.randn(m, k_in).bfloat16() for _, k_in in LINEARS.values()}
        flops = 2 * m * layers * sum(n * k_in for n, k_in in LINEARS.values())
        calls = [(xs[k_in], w, p) for k, (_, k_in) in LINEARS.items()
                 for w, p in zip(weights[k], packed[k], strict=True)]
        a = fastest(functools.partial(run_linears, calls, True), repeats)
        b = fastest(functools.partial(run_linears, calls, False), repeats)
        print(f"  rows {m:5d}: kernel {1e3 * a:8.1f} ({flops / a / 1e9:4.0f})   F.linear "
              f"{1e3 * b:8.1f} ({flops / b / 1e9:4.0f})   {b / a:.2f}x")


def attention_case(batch: int, ctx: int, q_len: int, layers: int):
    cfg = tiny_config(hidden_size=HIDDEN, num_heads=HEADS, num_kv_heads=KV_HEADS,
                      head_dim=HEAD_DIM, num_layers=layers)
    block = 16
    per_seq = -(-ctx // block)
    cache = PagedKVCache(cfg, 1 + batch * per_seq, block, torch.bfloat16)
    cache.data.normal_()
    tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(batch)]
    meta = build_step_meta([q_len] * batch, [ctx - q_len] * batch, tables, block,
                           HEADS // KV_HEADS, cache.num_blocks)
    heads = torch.randn(batch * q_len, HEADS + 2 * KV_HEADS, HEAD_DIM).bfloat16()
    q, k, v = heads[:, :HEADS], heads[:, HEADS:HEADS + KV_HEADS], heads[:, HEADS + KV_HEADS:]
    attn = PagedAttention(cache, meta)

    def run() -> None:
        for layer in range(layers):
            attn(layer, q, k, v)
    return run, tables


def bench_attention(decode_layers: int, repeats: int) -> None:
    run, _ = attention_case(64, 192, 1, decode_layers)
    kv_bytes = 64 * 192 * decode_layers * 2 * KV_HEADS * HEAD_DIM * 2
    a, b = fastest(run, repeats), fastest(torch_path(run), repeats)
    print(f"decode attention, batch 64 x 192 tokens, {decode_layers} layers: kernel "
          f"{1e3 * a:.1f} ms ({kv_bytes / a / 1e9:.1f} GB/s of KV)   torch {1e3 * b:.1f} ms   "
          f"{b / a:.2f}x")
    run, _ = attention_case(2, 512, 512, 1)
    flops = 2 * HEADS * (512 * 513 // 2) * HEAD_DIM * 4
    a, b = fastest(run, repeats), fastest(torch_path(run), repeats)
    print(f"prefill attention, 2 x 512 tokens, 1 layer: kernel {1e3 * a:.2f} ms "
          f"({flops / a / 1e9:.0f} GFLOP/s)   torch {1e3 * b:.2f} ms "
          f"({flops / b / 1e9:.0f} GFLOP/s)   {b / a:.2f}x")


def bench_step_meta(repeats: int) -> None:
    tables = [list(range(1 + i * 16, 1 + (i + 1) * 16)) for i in range(64)]
    calls = 200

    def run() -> None:
        for _ in range(calls):
            build_step_meta([1] * 64, [200] * 64, tables, 16, 3, 2000)
    print(f"build_step_meta, batch-64 decode: {1e6 * fastest(run, repeats) / calls:.0f} us")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--quick", action="store_true", help="a smoke run: 2 layers, 2 row counts")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    if ops.kernels(torch.zeros(1)) is None:
        print("engine_kernels: the kernel library did not load (see the warning above)",
              file=sys.stderr)
        return 2
    layers = 2 if args.quick else 30
    with torch.inference_mode():
        bench_gemm([1, 64] if args.quick else [1, 4, 8, 16, 64, 256, 1024], layers,
                   args.repeats)
        bench_attention(layers, args.repeats)
        bench_step_meta(args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
