"""The OpenAI surface kvfleet claims, checked with the real `openai` client against one base URL.

The checks are kvfleet_bench.conformance's; bench/router_vllm_overhead.py runs them against
four bases (vLLM direct, kvfleet's router in front of it, a kvfleet engine direct, the router
in front of that). Each case returns pass/fail and what it observed, so differences between
backends are shown, not hidden.

Cases: /v1/models; completion (whole and streamed, the same greedy text); chat (whole and
streamed, with `stream_options.include_usage`); usage fields; `max_tokens`; `stop`; and the
error body (OpenAI-style JSON, status, type) of a bad request and of an unknown model.

    .venv/bin/python bench/openai_conformance.py --base-url http://127.0.0.1:8000/v1 --model m
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from kvfleet_bench.conformance import check


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base-url", required=True, help="ending in /v1")
    p.add_argument("--model", required=True)
    args = p.parse_args(argv)
    cases = check(args.base_url, args.model)
    print(json.dumps([asdict(c) for c in cases], indent=1))
    return 0 if all(c.is_ok for c in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
