"""How the operator scales: N InferencePools against kmock, `kvfleet operator run` in its own
process, time until every pool's children exist, and the operator's peak RSS.

    .venv/bin/python bench/operator_scale.py --pools 1000 --json bench/results/operator_scale.json

kmock (0.8, with the shim that fills its gaps: bench/kvfleet_bench/kmock_shim.py) runs in
this process; the operator is the real console command (`kvfleet operator run
--all-namespaces`) with a kubeconfig pointing at it, exactly as tests/kubernetes runs it.
The pools (examples/vllm-unified.yaml, renamed) are created through the API as fast as the
mock takes them; the clock starts with the first create and stops when every pool has all
its children (2 Secrets, a ConfigMap, a NetworkPolicy, 2 Services, 2 PDBs, 2 Deployments).
Then the run holds `--hold` seconds to measure what the idle operator costs the API server
(requests per second). Peak RSS is the operator process's VmHWM from /proc.

So that the bench measures the operator, not the mock, `BenchShim` makes kmock behave as an
apiserver does where kmock's own shortcuts cost O(n) per request: it looks objects up by
key (kmock scans every object), creates the object a server-side apply names (kmock answers
404, and the operator falls back to POST then apply: three requests where a cluster sees
one), sends errors without a formatted traceback, and keeps no request history. The mock
is pinned to CPU 0 and the operator to CPU 1 (`--no-pin` to not), and the report gives
both processes' CPU seconds, so a mock-bound run shows as one.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp.web
import kmock
import yaml
from kvfleet_bench.kmock_shim import KubeShim, write_kubeconfig
from kvfleet_bench.procs import REPO_DIR as REPO
from kvfleet_bench.procs import cpu_seconds, free_port
from kvfleet_bench.readme import refresh_section
from kvfleet_bench.stats import spread

NS = "bench"


class BenchShim(KubeShim):
    """The shim without kmock's request history: kmock matches every request against every
    request it has ever seen (its assertion DSL), which is quadratic and, at tens of
    thousands of requests, would measure the mock, not the operator. Each request leaves the
    history once served; `num_served` counts them."""

    num_served = 0
    served_s = 0.0  # wall time spent answering (the mock shares the bench's one core)
    by_call: Counter[str] = Counter()  # "VERB plural", to see where requests go

    def _KubernetesEmulator__get_objs(self, request: kmock.Request, strict: bool) -> list[Any]:
        """kmock finds an object by scanning every object (O(n) per request, so O(n^2) for
        the run): look a named object up by its key, and scan only for lists and watches."""
        objects = self._objects._objects  # {(resource, namespace, name): Object}
        if request.name is not None and (strict or request.namespace is not None):
            found = objects.get((request.resource, request.namespace, request.name))
            return [] if found is None else [found]
        want = request.resource
        wanted = (want.group, want.version, want.plural) if want is not None else None
        return [obj for (res, ns, name), obj in objects.items()
                if (res.group, res.version, res.plural) == wanted
                and (request.namespace is None or ns == request.namespace)
                and (request.name is None or name == request.name)]  # fmt: skip

    async def _create_on_apply(self, request: kmock.Request) -> Any:
        """A real apiserver creates the object a server-side apply names when it is missing;
        kmock answers 404 (so the operator falls back to POST, then applies again: three
        requests where a cluster sees one). Do what the apiserver does, so the bench counts
        the requests a cluster would see."""
        data = request.data
        if (request.method.value != "PATCH" or request.subresource or request.name is None
                or "apply-patch" not in request.headers.get("Content-Type", "")
                or not isinstance(data, dict)):  # fmt: skip
            return None
        key = (request.resource, request.namespace, request.name)
        async with self._lock:
            if key in self._objects and not self._objects[key].deleted:
                return None
            raw = copy.deepcopy(data)
            metadata = raw.setdefault("metadata", {})
            metadata.update(namespace=request.namespace, name=request.name,
                            uid=str(uuid.uuid4()), generation=1,
                            resourceVersion=str(next(self._rv)),
                            creationTimestamp=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"))
            self._objects[key] = raw
            assert request.resource is not None
            await self._buses[request.resource].put({"type": "ADDED", "object": raw})
        return aiohttp.web.json_response(raw, status=201)

    async def _render_error(self, exc: Exception) -> Any:
        """kmock formats a traceback into every error body (each 404 of a Secret not made
        yet); an apiserver sends a short Status."""
        if isinstance(exc, kmock.KubernetesError):
            return aiohttp.web.json_response({
                "apiVersion": "v1", "kind": "Status", "metadata": {}, "code": exc.status,
                "status": "Failure", "reason": exc.reason or type(exc).__name__,
                "message": exc.message or repr(exc)}, status=exc.status)  # fmt: skip
        return await super()._render_error(exc)

    async def _handle(self, request: kmock.Request) -> Any:
        t0 = time.perf_counter()
        try:
            created = await self._create_on_apply(request)
            if created is not None:
                return created
            return await super()._handle(request)
        finally:
            self._requests.remove(request)
            cls = type(self)
            cls.num_served += 1
            cls.served_s += time.perf_counter() - t0
            verb = ("WATCH" if request.params.get("watch") == "true" else
                    request.method.value if request.method.value != "GET" or request.name
                    else "LIST")
            plural = request.resource.plural if request.resource is not None else "-"
            sub = f"/{request.subresource}" if request.subresource else ""
            cls.by_call[f"{verb} {plural}{sub}"] += 1

POOL_PATH = f"/apis/kvfleet.io/v1alpha1/namespaces/{NS}/inferencepools"
CHILDREN = {  # per pool
    "v1/secrets": 2, "v1/configmaps": 1, "networking.k8s.io/v1/networkpolicies": 1,
    "v1/services": 2, "policy/v1/poddisruptionbudgets": 2, "apps/v1/deployments": 2,
}  # fmt: skip


EXAMPLE = yaml.safe_load((REPO / "examples" / "vllm-unified.yaml").read_text())


def pool_body(i: int) -> dict[str, Any]:
    data = copy.deepcopy(EXAMPLE)
    data["metadata"] = {"name": f"pool-{i:04d}", "namespace": NS}
    return data


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of the process itself so far (not its children: the
    bench's own process has the operator as a child)."""
    return cpu_seconds(pid, with_descendants=False)


def vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def count_children(shim: KubeShim, num_pools: int) -> int:
    """How many pools have every child (counted per kind, by the pool label)."""
    per_pool: Counter[str] = Counter()
    for resource, each in CHILDREN.items():
        owners = Counter(o.raw.get("metadata", {}).get("labels", {}).get("kvfleet.io/pool")
                         for (r, _, _), o in shim.objects.items()
                         if str(r.plural) == resource.rsplit("/", 1)[1] and not o.deleted)
        for pool, n in owners.items():
            if pool and n >= each:
                per_pool[pool] += 1
    return sum(1 for n in per_pool.values() if n == len(CHILDREN))


def num_requests(shim: KubeShim) -> int:
    return BenchShim.num_served


async def create_pools(url: str, num_pools: int, concurrency: int) -> None:
    import aiohttp

    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(num_pools):
        queue.put_nowait(i)

    async def worker(http: aiohttp.ClientSession) -> None:
        while not queue.empty():
            i = queue.get_nowait()
            async with http.post(url + POOL_PATH, json=pool_body(i)) as resp:
                assert resp.status < 300, await resp.text()

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(worker(http) for _ in range(concurrency)))


async def run(args: argparse.Namespace) -> dict[str, Any]:
    BenchShim.num_served, BenchShim.served_s, BenchShim.by_call = 0, 0.0, Counter()  # per run
    async with BenchShim() as shim, kmock.Server(shim) as server:
        shim.declare()
        url = str(server.url).rstrip("/")
        with tempfile.TemporaryDirectory() as tmp:
            kubeconfig = write_kubeconfig(Path(tmp) / "kubeconfig", url)
            env = {**os.environ, "KUBECONFIG": str(kubeconfig), "HOME": tmp}
            profile = ["-m", "cProfile", "-o", str(args.profile)] if args.profile else []
            cmd = [sys.executable, *profile, "-m", "kvfleet_operator.cli.main", "operator", "run",
                   "--all-namespaces", "--liveness", f"http://127.0.0.1:{free_port()}/healthz",
                   *(["--max-tick", str(args.max_tick)] if args.max_tick else [])]
            log = open(Path(tmp) / "operator.log", "wb")  # noqa: SIM115
            operator = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
            if args.pin and (os.cpu_count() or 1) >= 2:  # the mock must not steal its core
                os.sched_setaffinity(0, {0})
                os.sched_setaffinity(operator.pid, {1})
            try:
                await asyncio.sleep(args.settle)  # kopf starts and watches (nothing to do yet)
                rss_idle = vm_hwm_mb(operator.pid)
                cpu0 = cpu_s(operator.pid), cpu_s(os.getpid())
                started = time.monotonic()
                await create_pools(url, args.pools, args.concurrency)
                created_s = time.monotonic() - started
                done, done_s = 0, None
                while time.monotonic() - started < args.timeout:
                    done = count_children(shim, args.pools)
                    if done >= args.pools:
                        done_s = time.monotonic() - started
                        break
                    if operator.poll() is not None:
                        break
                    if args.verbose:
                        kinds = Counter(str(r.plural) for (r, _, _), o in shim.objects.items()
                                        if not o.deleted)
                        print(f"{time.monotonic() - started:.1f}s {done} pools done {dict(kinds)}",
                              file=sys.stderr)
                    await asyncio.sleep(0.5)
                cpu1 = cpu_s(operator.pid) - cpu0[0], cpu_s(os.getpid()) - cpu0[1]
                # Idle means steady state: every loop past its first ticks (token read, first
                # status and events), which come up to one tick after the children exist.
                await asyncio.sleep(args.idle_after)
                before, t0 = num_requests(shim), time.monotonic()
                calls_before = Counter(BenchShim.by_call)
                await asyncio.sleep(args.hold)
                idle_rps = (num_requests(shim) - before) / (time.monotonic() - t0)
                idle_calls = Counter(BenchShim.by_call)
                idle_calls.subtract(calls_before)
                rss_peak = vm_hwm_mb(operator.pid)
            finally:
                if operator.poll() is None:
                    operator.send_signal(signal.SIGTERM)
                    try:
                        operator.wait(60)
                    except subprocess.TimeoutExpired:
                        operator.kill()
                log.close()
                text = (Path(tmp) / "operator.log").read_text(errors="replace")
                if args.log:
                    args.log.write_text(text)
                if args.verbose:
                    print(text[-4000:], file=sys.stderr)
            num_tracebacks = text.count("Traceback")
    return {
        "num_pools": args.pools,
        "seconds_to_all_children": None if done_s is None else round(done_s, 1),
        "seconds_to_create_pools": round(created_s, 1),
        "num_pools_with_all_children": done,
        "operator_peak_rss_mb": round(rss_peak, 1),
        "operator_cpu_s_until_children": round(cpu1[0], 1),
        "mock_cpu_s_until_children": round(cpu1[1], 1),  # kmock + this bench, one process
        "operator_idle_rss_mb_before_pools": round(rss_idle, 1),
        "idle_api_requests_per_s": round(idle_rps, 1),
        "hold_s": args.hold,
        "idle_after_s": args.idle_after,
        "max_tick_s": args.max_tick,
        "pinned": bool(args.pin and (os.cpu_count() or 1) >= 2),
        "operator_tracebacks": num_tracebacks,
        "api_requests": BenchShim.num_served,
        "mock_busy_s": round(BenchShim.served_s, 1),
        "api_requests_by_call": dict(BenchShim.by_call.most_common()),
        "idle_api_requests_by_call": {k: v for k, v in idle_calls.most_common() if v > 0},
        "targets": {"seconds_to_all_children": 60, "operator_peak_rss_mb": 300},
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "commit": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                                 capture_output=True, text=True).stdout.strip(),  # fmt: skip
        "machine": f"{platform.machine()}, {os.cpu_count()} cores (shared)",
        "command": "python bench/operator_scale.py " + " ".join(sys.argv[1:]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pools", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=20, help="pool creates in flight")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--hold", type=float, default=20.0, help="idle seconds measured after")
    parser.add_argument("--settle", type=float, default=3.0)
    parser.add_argument("--idle-after", type=float, default=12.0,
                        help="seconds after the children exist before idle is measured")
    parser.add_argument("--max-tick", type=float, default=None, help="operator --max-tick")
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--verbose", action="store_true")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="do not pin the mock to CPU 0 and the operator to CPU 1")
    parser.add_argument("--log", type=Path, default=None, help="keep the operator's log here")
    parser.add_argument("--profile", type=Path, default=None, help="cProfile the operator")
    parser.add_argument("--repeat", type=int, default=1, help="runs; medians and spread")
    args = parser.parse_args()
    runs = []
    for i in range(args.repeat):
        runs.append(asyncio.run(run(args)))
        print(f"run {i + 1}/{args.repeat}: {runs[-1]['seconds_to_all_children']} s, "
              f"{runs[-1]['operator_peak_rss_mb']} MB", file=sys.stderr)
    result = {"summary": summarize(runs), "runs": runs}
    print(json.dumps(result["summary"], indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        refresh_section("operator_scale", args.json)
    ok = all(r["num_pools_with_all_children"] == args.pools for r in runs)
    sys.exit(0 if ok else 1)


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Median, min and max of each figure over the runs."""
    out: dict[str, Any] = {"num_pools": runs[0]["num_pools"], "num_runs": len(runs)}
    for key in ("seconds_to_all_children", "operator_peak_rss_mb",
                "operator_cpu_s_until_children", "mock_cpu_s_until_children",
                "idle_api_requests_per_s", "api_requests", "operator_tracebacks"):
        values = [r[key] for r in runs if r[key] is not None]
        if values:
            out[key] = spread(values)
    for key in ("targets", "date", "commit", "machine", "pinned", "command"):
        out[key] = runs[-1][key]
    return out


if __name__ == "__main__":
    main()
