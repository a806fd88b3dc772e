"""Greedy token ids from vLLM's offline LLM (run with the vLLM venv's python).

    python tests/vllm/vllm_greedy.py FOLDER DTYPE MAX_TOKENS < prompts.json  -> JSON list
"""

from __future__ import annotations

import json
import sys


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    folder, dtype, max_tokens = sys.argv[1], sys.argv[2], int(sys.argv[3])
    prompts = json.load(sys.stdin)
    llm = LLM(model=folder, dtype=dtype, enforce_eager=True, block_size=32,
              max_model_len=1024, seed=0)
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params)
    print("RESULT " + json.dumps([list(o.outputs[0].token_ids) for o in outs]))


if __name__ == "__main__":  # vLLM starts its workers with spawn
    main()
