"""Send corpus cases over raw sockets, run a good stream beside them, read process logs.

Hostile cases come from other loopback addresses than the good stream (127.0.0.2 and up;
Linux routes all of 127/8 to lo), as separate clients would: the per-address upload cap
then bounds each hostile client without touching the good one on 127.0.0.1.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from corpus import BODY_TIMEOUT_S, MAX_UPLOADS, Case, request

HOST = "127.0.0.1"


@dataclass
class Reply:
    status: int | None  # None: no status line came back
    body: bytes = b""

    def error(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.body)
        except ValueError:
            return None
        err = data.get("error") if isinstance(data, dict) else None
        return err if isinstance(err, dict) else None


def _read_reply(sock: socket.socket) -> Reply:
    data = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except (ConnectionResetError, TimeoutError, OSError):
            break
        if not chunk:
            break
        data += chunk
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = [int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")]
            if length and len(body) >= length[0]:
                break
    if not data.startswith(b"HTTP/"):
        return Reply(None, data)
    head, _, body = data.partition(b"\r\n\r\n")
    return Reply(int(head.split(b" ", 2)[1]), body)


def send(port: int, case: Case, source: str, timeout_s: float = 20.0) -> Reply:
    with socket.create_connection((HOST, port), timeout=timeout_s,
                                  source_address=(source, 0)) as sock:
        try:
            sock.sendall(case.data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server already answered and closed: read what it said
        if case.then == "read-abort":
            sock.recv(64)  # the answer has begun (a stream's head), then the client is gone
        if case.then in ("abort", "read-abort"):
            # linger 0: the close is a reset, as a client that crashed mid-upload
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return Reply(None)
        return _read_reply(sock)


def problems(case: Case, reply: Reply) -> list[str]:
    """What is wrong with one reply (empty: it is as the corpus says)."""
    if case.expect is None:
        return []
    out = []
    if reply.status is None:
        return [f"no HTTP answer: {reply.body[:200]!r}"]
    if case.expect == "4xx":
        if not 400 <= reply.status < 500:
            out.append(f"status {reply.status}, want 4xx")
    elif reply.status != case.expect:
        out.append(f"status {reply.status}, want {case.expect}")
    err = reply.error()
    if case.shape and (err is None or not isinstance(err.get("message"), str)
                       or not isinstance(err.get("type"), str)):
        out.append(f"not OpenAI's error shape: {reply.body[:200]!r}")
    if case.code is not None and (err or {}).get("code") != case.code:
        out.append(f"code {(err or {}).get('code')!r}, want {case.code!r}")
    return out


def run_corpus(port: int, cases: list[Case], num_workers: int = 4) -> dict[str, list[str]]:
    """Every case, concurrently; {case id: problems} for the ones that went wrong.

    Quick cases share one hostile address; each stalled or aborted upload gets its own, so
    that the upload cap never turns an unrelated case into a 429."""
    def source(i: int, case: Case) -> str:
        return "127.0.0.2" if case.then == "wait" else f"127.0.1.{i % 250 + 1}"

    with ThreadPoolExecutor(num_workers) as pool:
        futures = {c.id: (c, pool.submit(send, port, c, source(i, c)))
                   for i, c in enumerate(cases)}
        found = {}
        for cid, (case, fut) in futures.items():
            try:
                bad = problems(case, fut.result())
            except OSError as exc:
                bad = [f"socket error: {exc!r}"]
            if bad:
                found[cid] = bad
        return found


def upload_cap_problems(port: int, path: str = "/v1/completions") -> list[str]:
    """MAX_UPLOADS stalled uploads from one address, then one more: it gets a 429 at once,
    while another address still uploads; the stalled ones end in 408."""
    stall = request("POST", path, b'{"prompt": "', length=100)
    source = "127.0.2.1"
    socks = [socket.create_connection((HOST, port), timeout=10, source_address=(source, 0))
             for _ in range(MAX_UPLOADS)]
    out = []
    try:
        for s in socks:
            s.sendall(stall)
        time.sleep(0.3)  # let the server start reading all of them
        t0 = time.monotonic()
        extra = send(port, Case("cap", stall, 429, code="too_many_uploads"), source)
        out += [f"over the cap: {p}" for p in problems(
            Case("cap", stall, 429, code="too_many_uploads"), extra)]
        if time.monotonic() - t0 > BODY_TIMEOUT_S / 2:
            out.append("the over-cap upload was not refused at once")
        other = send(port, Case("other", stall, 408, code="body_timeout"), "127.0.2.2")
        out += [f"another address: {p}" for p in problems(
            Case("other", stall, 408, code="body_timeout"), other)]
        for s in socks:
            out += [f"stalled: {p}" for p in problems(
                Case("s", stall, 408, code="body_timeout"), _read_reply(s))]
    finally:
        for s in socks:
            s.close()
    return out


def stream_text(url: str, body: dict[str, Any], timeout_s: float = 60) -> tuple[str, str]:
    """(generated text, finish reason) of one streamed completion, from 127.0.0.1."""
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    text, finish, done = [], "", False
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        assert resp.status == 200
        for line in resp:
            if not line.startswith(b"data: "):
                continue
            payload = line[6:].strip()
            if payload == b"[DONE]":
                done = True
                break
            choice = json.loads(payload)["choices"][0]
            text.append(choice.get("text") or "")
            finish = choice.get("finish_reason") or finish
    assert done, "the stream ended without [DONE]"
    return "".join(text), finish


GOOD = {"model": "tiny-random", "prompt": "a good client's stream, running throughout",
        "max_tokens": 48, "temperature": 0, "stream": True}


@dataclass
class GoodStreams:
    """Streams GOOD again and again in a thread until stopped; keeps every result."""

    url: str
    results: list[tuple[str, str]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> GoodStreams:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.results.append(stream_text(self.url, GOOD))
            except Exception as exc:  # noqa: BLE001 - recorded, asserted by the test
                self.errors.append(repr(exc))

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(timeout=60)


def log_problems(text: str) -> list[str]:
    """Lines at ERROR or tracebacks in a process log."""
    return [line for line in text.splitlines()
            if " ERROR " in line or "Traceback" in line or "CRITICAL" in line]
