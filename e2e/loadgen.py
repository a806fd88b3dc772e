"""A closed-loop load generator for e2e/kind.sh, standard library only (it runs in a pod of
kvfleet's image, which has no shell: `python /e2e/loadgen.py ...`).

CONCURRENCY workers each send one completion after another to URL until the stop file exists
(or --max-seconds pass), then finish what they have in flight. Every few seconds it prints a
progress line; at the end one line `SUMMARY {"ok": N, "failed": M, "errors": {...}}`. A
request counts as ok only with HTTP 200 and a JSON body with choices: anything else (a 429,
a 503, a reset connection, a timeout) is a failure, so "zero failed" means the fleet lost
nothing while it scaled.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.error
import urllib.request
from collections import Counter


def one_request(url: str, model: str, max_tokens: int, n: int, timeout: float) -> str | None:
    """None when served; else a short error class for the summary."""
    body = json.dumps({"model": model, "prompt": f"Request {n}: tell me about fleets of",
                       "max_tokens": max_tokens, "temperature": 0.0}).encode()
    req = urllib.request.Request(f"{url}/v1/completions", data=body, method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            answer = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return f"http {e.code}"
    except (OSError, ValueError) as e:
        return type(e).__name__
    return None if answer.get("choices") else "no choices"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", required=True, help="the router, e.g. http://e2e-cpu-router:8000")
    p.add_argument("--model", required=True)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--stop-file", default="/tmp/stop")
    p.add_argument("--max-seconds", type=float, default=1800)
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--report-every", type=float, default=5)
    args = p.parse_args()

    lock = threading.Lock()
    counts: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    deadline = time.monotonic() + args.max_seconds
    numbers = iter(range(10**9))

    def stopping() -> bool:
        return os.path.exists(args.stop_file) or time.monotonic() > deadline

    def worker() -> None:
        while not stopping():
            with lock:
                n = next(numbers)
            error = one_request(args.url, args.model, args.max_tokens, n, args.timeout)
            with lock:
                counts["failed" if error else "ok"] += 1
                if error:
                    errors[error] += 1

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(args.concurrency)]
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        time.sleep(args.report_every)
        with lock:
            print(f"progress ok={counts['ok']} failed={counts['failed']}", flush=True)
    summary = {"ok": counts["ok"], "failed": counts["failed"], "errors": dict(errors)}
    print("SUMMARY " + json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
