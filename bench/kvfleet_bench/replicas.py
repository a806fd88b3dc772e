"""Several kvfleet router replicas of one pool behind a real L4 balancer (balancer.py).

Every replica gets the same admin token (so the same PYTHONHASHSEED: `kvfleet router`
derives it from the token) and the same config: a static pool of the backends plus, with
the exchange on, `exchange: {enabled: true, peers: [every replica's URL]}` (a replica skips
itself by id). That is what the operator pushes to a pool's router Deployment, with the
Kubernetes Service replaced by Envoy in TCP mode.

Each replica runs with `--stop-delay-s 1`: on SIGTERM its /health turns 503 and it serves on
for a second, so Envoy's health check (every 0.25 s) takes it out before its port closes, as
a pod's preStop sleep does behind a Service (without it, a connection Envoy had just opened
to the stopping replica was reset: one client error per restart).

`restart(i)` stops replica i (SIGTERM, the way a rollout or eviction stops a pod) and
starts it again on the same port with the same command, so it warms from a peer
(`exchange.warm`, on by default) and Envoy's health check puts it back in the rotation.
"""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from kvfleet_bench import balancer, procs, routers

STOP_DELAY_S = "1"  # > Envoy's health-check interval (balancer.py), as a preStop sleep


@dataclass(slots=True)
class Replica:
    index: int
    url: str
    cmd: list[str]
    log: Path
    cpus: str | None
    proc: subprocess.Popen | None = None
    started_s: list[float] = field(default_factory=list)  # wall time each start was ready

    @property
    def hostport(self) -> str:
        return self.url.removeprefix("http://")

    def start(self) -> None:
        self.proc = procs.start(self.cmd, self.log, self.cpus)
        procs.wait_until(partial(procs.http_get, f"{self.url}/health"), self.proc,
                         f"kvfleet router replica {self.index}", 60)
        self.started_s.append(time.time())

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)


def replica_config(backends: list[str], policy: str, urls: list[str], is_exchange: bool,
                   endpoint: dict | None = None,
                   sections: dict[str, dict] | None = None) -> dict:
    config = routers.kvfleet_config(backends, policy, endpoint, sections)
    config["exchange"] = {"enabled": True, "peers": list(urls)} if is_exchange else {
        "enabled": False}
    return config


@dataclass(slots=True)
class ReplicaSet:
    name: str
    replicas: list[Replica]
    balancer: balancer.Balancer

    @classmethod
    def start(cls, num_replicas: int, is_exchange: bool, policy: str, backends: list[str],
              workdir: Path, cpus: str | None, endpoint: dict | None = None,
              sections: dict[str, dict] | None = None) -> ReplicaSet:
        name = f"kvfleet-replicas{num_replicas}" + ("" if is_exchange else "-noexchange")
        ports = [procs.free_port() for _ in range(num_replicas)]
        urls = [f"http://{procs.HOST}:{p}" for p in ports]
        config_path = workdir / f"{name}-{policy}.json"
        config_path.write_text(json.dumps(
            replica_config(backends, policy, urls, is_exchange, endpoint, sections)))
        token = routers.admin_token_file(workdir)
        replicas = [Replica(i, url, routers.kvfleet_command(config_path, port, token,
                                                            ["--stop-delay-s", STOP_DELAY_S]),
                            workdir / f"{name}-{policy}-r{i}.log", cpus)
                    for i, (port, url) in enumerate(zip(ports, urls, strict=True))]
        started: list[Replica] = []
        try:
            for r in replicas:
                r.start()
                started.append(r)
            bal = balancer.start(urls, workdir, cpus, tag=f"envoy-{name}-{policy}")
        except BaseException:
            for r in started:
                r.stop()
            raise
        return cls(name, replicas, bal)

    def pids(self) -> list[int]:
        return [r.proc.pid for r in self.replicas if r.proc is not None and r.proc.poll() is None]

    def restart(self, index: int, down_s: float = 0.0) -> float:
        """Stop replica `index`, wait `down_s`, start it again; returns the wall time it
        answered /health (Envoy routes to it from its next health check)."""
        replica = self.replicas[index]
        replica.stop()
        if down_s > 0:
            time.sleep(down_s)
        replica.start()
        return replica.started_s[-1]

    def replica_of(self) -> dict[str, int]:
        """host:port (as Envoy logs it) -> replica index."""
        return {r.hostport: r.index for r in self.replicas}

    def stop(self) -> None:
        self.balancer.stop()
        for r in self.replicas:
            r.stop()
