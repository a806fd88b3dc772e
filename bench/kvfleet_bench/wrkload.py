"""A fast load side for the router benchmark: Debian's `wrk` (C, epoll) with a Lua script.

- Requests are `POST /v1/completions` SSE streams with distinct prompts ("hello N").
- Each connection may wait a random think time (uniform in [0, 2 x think_ms]) before every
  request, so a level can offer a fixed rate (~connections / think) instead of saturating.
- wrk runs under `quickack.so` (kvfleet_bench/quickack.c, built with gcc on first use), which
  acknowledges every segment at once, like loadgen's TCP_QUICKACK.
- Several URLs (direct access to several backends) are spread over wrk threads.

`available()` says whether wrk and the shim can be used; otherwise callers fall back to
kvfleet_bench.loadgen (pure Python, slower).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from kvfleet_bench import procs
from kvfleet_bench.stats import LoadStats

SHIM_SRC = Path(__file__).with_name("quickack.c")
CACHE = procs.BENCH_DIR / ".cache"

LUA = r"""
local bodies = {}
local i = 0
local think = 0
local addrs = {}
local nthread = 0

function setup(thread)
  -- thread k of a direct run talks to backend k (mod the number of backends)
  local hostports = {}
  for hp in string.gmatch(os.getenv("WRK_TARGETS") or "", "[^,]+") do
    table.insert(hostports, hp)
  end
  if #hostports > 1 then
    local hp = hostports[(nthread % #hostports) + 1]
    local host, port = string.match(hp, "([^:]+):(%d+)")
    thread.addr = wrk.lookup(host, port)[1]
  end
  thread:set("tid", nthread)
  nthread = nthread + 1
end

function init(args)
  local max_tokens = tonumber(args[1] or "8")
  think = tonumber(args[2] or "0")
  for n = 1, 1024 do
    bodies[n] = wrk.format("POST", "/v1/completions",
      {["Content-Type"] = "application/json"},
      string.format('{"model":"fake-model","prompt":"hello %d %d","max_tokens":%d,"stream":true}',
                    tid or 0, n, max_tokens))
  end
  math.randomseed(1234 + (tid or 0))
end

if tonumber(os.getenv("WRK_THINK_MS") or "0") > 0 then
  function delay()
    return math.random(0, 2 * think)
  end
end

function request()
  i = i % #bodies + 1
  return bodies[i]
end

function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'WRK {"requests":%d,"duration_us":%d,"p50_us":%d,"p90_us":%d,"p99_us":%d,' ..
    '"mean_us":%f,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(90),
    latency:percentile(99), latency.mean, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


@dataclass(slots=True)
class WrkStats(LoadStats):
    connections: int
    think_ms: float
    p90_ms: float
    mean_ms: float


def shim_path() -> Path | None:
    """quickack.so, built from quickack.c when missing or older than its source."""
    out = CACHE / "quickack.so"
    if out.exists() and out.stat().st_mtime >= SHIM_SRC.stat().st_mtime:
        return out
    gcc = shutil.which("gcc") or shutil.which("cc")
    if gcc is None:
        return None
    CACHE.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([gcc, "-O2", "-shared", "-fPIC", "-o", str(out), str(SHIM_SRC), "-ldl"],
                          capture_output=True, text=True)
    return out if proc.returncode == 0 else None


def available() -> tuple[bool, str]:
    if shutil.which("wrk") is None:
        return False, "wrk not installed (apt-get install -y wrk)"
    if shim_path() is None:
        return False, "no C compiler to build kvfleet_bench/quickack.c"
    return True, "wrk " + version()


def version() -> str:
    proc = subprocess.run(["wrk", "-v"], capture_output=True, text=True)
    first = (proc.stdout or proc.stderr).strip().splitlines()
    return first[0].split()[1] if first and len(first[0].split()) > 1 else "?"


def run(urls: list[str], connections: int, think_ms: float, duration_s: float,
        max_tokens: int, workdir: Path, cpus: str | None, timeout_s: float = 10.0) -> WrkStats:
    script = workdir / "wrk_post.lua"
    if not script.exists():
        script.write_text(LUA)
    threads = max(1, min(len(urls) if len(urls) > 1 else 2, connections))
    hostports = [urlsplit(u).netloc for u in urls]
    shim = shim_path()
    env = {"WRK_TARGETS": ",".join(hostports), "WRK_THINK_MS": str(think_ms)}
    if shim is not None:
        env["LD_PRELOAD"] = str(shim)
    seconds = max(1, round(duration_s))  # wrk takes whole seconds
    cmd = [*procs.pin_prefix(cpus), "wrk", "-t", str(threads), "-c", str(connections),
           "-d", f"{seconds}s", "--timeout", f"{timeout_s:g}s", "-s", str(script), urls[0],
           "--", str(max_tokens), str(int(think_ms))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env},
                          timeout=seconds + timeout_s + 30)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("WRK ")), None)
    if proc.returncode != 0 or line is None:
        raise RuntimeError(f"wrk failed (rc {proc.returncode}): {proc.stderr.strip()[-500:]}")
    d = json.loads(line.removeprefix("WRK "))
    errors = {k: int(d[k]) for k in ("connect", "read", "write", "status", "timeout") if d[k]}
    dur = d["duration_us"] / 1e6
    num_ok = int(d["requests"]) - int(d["status"])
    return WrkStats(connections=connections, think_ms=think_ms, duration_s=dur, num_ok=num_ok,
                    num_errors=sum(errors.values()), errors=errors,
                    rps=num_ok / dur if dur else 0.0, p50_ms=d["p50_us"] / 1e3,
                    p90_ms=d["p90_us"] / 1e3, p99_ms=d["p99_us"] / 1e3,
                    mean_ms=d["mean_us"] / 1e3)

