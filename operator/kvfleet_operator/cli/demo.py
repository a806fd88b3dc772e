"""`make run`: start a local fleet from a pool file, ask it one chat question, stop it.

It runs `kvfleet up POOL` as a child (its progress is shown, indented), waits until every role
has a ready replica, sends one chat request through the router with the `openai` client,
prints the answer and stops the fleet with SIGINT. Any failure ends in one line on stderr and
a non-zero exit, and the fleet is stopped all the same.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kvfleet_operator.api.errors import SpecError
from kvfleet_operator.api.pool import load_pool
from kvfleet_operator.runtimes.local.procs import die_with_parent, last_line

QUESTION = "What is the capital of France? Answer in one sentence."
READY_TIMEOUT_S = 600.0  # loading a real model on a busy 2-core machine takes a while
ANSWER_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 90.0
MAX_RESTARTS_WHILE_WAITING = 2


class DemoError(Exception):
    """A one-line reason the demo failed."""


def _say(message: str) -> None:
    print(f"kvfleet demo: {message}", flush=True)


def _relay(stream: Any) -> None:
    for line in iter(stream.readline, ""):
        print(f"    up | {line.rstrip()}", flush=True)


def _read_state(state_dir: Path) -> dict[str, Any]:
    try:
        data = json.loads((state_dir / "state.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}


def _fail_if_crash_looping(state: dict[str, Any], state_dir: Path) -> None:
    """A process that keeps dying will not get better by waiting: say why, at once."""
    for rep in state.get("replicas", []):
        if rep.get("num_restarts", 0) >= MAX_RESTARTS_WHILE_WAITING and rep.get("state") != "ready":
            log = state_dir / "logs" / f"{rep['name']}.log"
            raise DemoError(f"{rep['name']} keeps exiting (code {rep.get('last_exit_code')}): "
                            f"{last_line(log) or '(no log line)'}")


def _wait_ready(up: subprocess.Popen, state_dir: Path, roles: list[str]) -> str:
    """The fleet's endpoint once `up` says it serves (every role has a ready replica in the
    router's config)."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if up.poll() is not None:
            raise DemoError(f"`kvfleet up` exited with {up.returncode} before the fleet was ready")
        state = _read_state(state_dir)
        _fail_if_crash_looping(state, state_dir)
        ready = {r["role"] for r in state.get("replicas", []) if r.get("state") == "ready"}
        if state.get("is_serving") and all(role in ready for role in roles):
            return str(state["endpoint"])
        time.sleep(0.5)
    raise DemoError(f"the fleet was not ready after {READY_TIMEOUT_S:.0f}s "
                    f"(logs in {state_dir / 'logs'})")


def _ask(endpoint: str, model: str) -> str:
    import openai

    client = openai.OpenAI(base_url=endpoint, api_key="unused", timeout=ANSWER_TIMEOUT_S,
                           max_retries=0)
    try:
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": QUESTION}],
            max_tokens=48,
            temperature=0.0,
        )
    except openai.APIError as exc:
        raise DemoError(f"the chat request failed: {exc}") from None
    answer = (reply.choices[0].message.content or "").strip() if reply.choices else ""
    if not answer:
        raise DemoError("the fleet answered with an empty message")
    return answer


def _stop(up: subprocess.Popen) -> int:
    if up.poll() is None:
        up.send_signal(signal.SIGINT)
        try:
            up.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            up.kill()  # its children die with it (PR_SET_PDEATHSIG)
            up.wait()
    return up.returncode


def run(pool_path: str) -> int:
    pool = load_pool(pool_path)
    roles = list(pool.spec.topology.roles())
    with tempfile.TemporaryDirectory(prefix="kvfleet-demo-") as tmp:
        state_dir = Path(tmp) / pool.name
        _say(f"starting `kvfleet up {pool_path}` ({pool.spec.model.name}, roles: "
             f"{', '.join(roles)})")
        up = subprocess.Popen(
            [sys.executable, "-m", "kvfleet_operator.cli.main", "up", pool_path,
             "--state-dir", str(state_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            text=True, bufsize=1,
            preexec_fn=die_with_parent(os.getpid()),  # noqa: PLW1509 - main thread only
        )
        relay = threading.Thread(target=_relay, args=(up.stdout,), daemon=True)
        relay.start()
        try:
            _say("waiting for the router and a ready replica per role (loading the model)")
            endpoint = _wait_ready(up, state_dir, roles)
            _say(f"fleet ready at {endpoint}; asking: {QUESTION}")
            started = time.monotonic()
            answer = _ask(endpoint, pool.spec.model.api_name)
            _say(f"answer ({time.monotonic() - started:.1f}s): {answer}")
        finally:
            _say("stopping the fleet")
            code = _stop(up)
            relay.join(timeout=5)
        if code != 0:
            raise DemoError(f"`kvfleet up` exited with {code} while stopping")
    _say("done: the fleet answered and stopped cleanly")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    pool = args[0] if args else "examples/local-cpu.yaml"
    try:
        return run(pool)
    except (DemoError, SpecError) as exc:
        print(f"kvfleet demo: failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("kvfleet demo: interrupted; the fleet was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
