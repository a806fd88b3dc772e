"""A reference Envoy bootstrap for the endpoint picker, shaped like GIE's test config.

    cfg = envoy_bootstrap(listen_port=8081, admin_port=19000, epp_port=9002,
                          options=EnvoyOptions())       # a dict; dump it as JSON or YAML

* an HTTP listener whose `ext_proc` filter asks the picker over gRPC (TLS without
  verification, as GIE's reference gateways talk to a self-signed picker): request
  headers SEND, the body BUFFERED (or FULL_DUPLEX_STREAMED, GIE's reference mode, with
  response bodies and trailers too), response headers SEND, `failure_mode_allow` =
  fail-open, `envoy.lb` metadata accepted from the picker and `envoy.lb.subset_hint`
  forwarded to it;
* `lb="original-dst"`: an ORIGINAL_DST cluster routing by `x-gateway-destination-endpoint`
  (one endpoint: the picker's fallbacks must then be 0);
* `lb="override-host"`: the pool's endpoints (`pool`, `ip:port` each) under Envoy's
  override_host policy, which reads the picker's metadata list (primary, then fallbacks;
  retries walk the list) and round-robins when there is no pick (how fail-open reaches a
  pod); what a gateway builds from a GIE InferencePool's selector;
* a header_mutation filter ahead of ext_proc drops any `x-gateway-destination-endpoint` a
  client sent, so only the picker's can reach the cluster, even failing open;
* the route adds `x-gateway-destination-endpoint-served` (the upstream Envoy reached),
  which the picker reads back and strips; `debug_headers` adds two more for tests: the
  served upstream and the pick as Envoy applied it.

Used by tests/epp, bench/epp_overhead.py and docs/gateway.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
DEBUG_SERVED = "x-kvfleet-test-served"
DEBUG_PICKED = "x-kvfleet-test-picked"
_T = "type.googleapis.com/envoy."


@dataclass(slots=True)
class EnvoyOptions:
    body_mode: str = "BUFFERED"  # or FULL_DUPLEX_STREAMED
    fail_open: bool = False  # failure_mode_allow
    lb: str = "original-dst"  # or "override-host" (needs pool)
    pool: list[str] = field(default_factory=list)  # ip:port of the pool's endpoints
    num_retries: int = 2  # override-host: tries down the fallback list
    epp_tls: bool = True
    epp_host: str = "127.0.0.1"
    message_timeout_s: float = 30.0  # above the picker's hold-queue timeout
    debug_headers: bool = False

    def __post_init__(self) -> None:
        if self.body_mode not in ("BUFFERED", "FULL_DUPLEX_STREAMED"):
            raise ValueError("body_mode must be BUFFERED or FULL_DUPLEX_STREAMED")
        if self.lb not in ("original-dst", "override-host"):
            raise ValueError("lb must be original-dst or override-host")
        if self.lb == "override-host" and not self.pool:
            raise ValueError("override-host needs the pool's endpoints")


def _socket(address: str, port: int) -> dict[str, Any]:
    return {"socket_address": {"address": address, "port_value": port}}


def _endpoints(name: str, addrs: list[tuple[str, int]]) -> dict[str, Any]:
    return {"cluster_name": name, "endpoints": [{"lb_endpoints": [
        {"endpoint": {"address": _socket(a, p)}} for a, p in addrs]}]}


def _ext_proc(o: EnvoyOptions) -> dict[str, Any]:
    full_duplex = o.body_mode == "FULL_DUPLEX_STREAMED"
    return {
        "@type": _T + "extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {"envoy_grpc": {"cluster_name": "epp"}, "timeout": "10s"},
        "failure_mode_allow": o.fail_open,
        "message_timeout": f"{o.message_timeout_s:g}s",
        "processing_mode": {
            "request_header_mode": "SEND", "response_header_mode": "SEND",
            "request_body_mode": o.body_mode,
            "response_body_mode": "FULL_DUPLEX_STREAMED" if full_duplex else "NONE",
            "request_trailer_mode": "SEND" if full_duplex else "SKIP",
            "response_trailer_mode": "SEND" if full_duplex else "SKIP"},
        "metadata_options": {"receiving_namespaces": {"untyped": ["envoy.lb"]},
                             "forwarding_namespaces": {"untyped": ["envoy.lb.subset_hint"]}},
    }


def _pool_cluster(o: EnvoyOptions) -> dict[str, Any]:
    if o.lb == "original-dst":
        return {"name": "pool", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                "connect_timeout": "2s",
                "original_dst_lb_config": {"use_http_header": True,
                                           "http_header_name": DESTINATION}}
    round_robin = {"typed_extension_config": {
        "name": "envoy.load_balancing_policies.round_robin",
        "typed_config": {"@type": _T + "extensions.load_balancing_policies.round_robin.v3"
                                       ".RoundRobin"}}}
    override_host = {"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {
            "@type": _T + "extensions.load_balancing_policies.override_host.v3.OverrideHost",
            "override_host_sources": [{"metadata": {"key": "envoy.lb",
                                                    "path": [{"key": DESTINATION}]}}],
            "fallback_policy": {"policies": [round_robin]}}}}
    addrs = [(a.rsplit(":", 1)[0], int(a.rsplit(":", 1)[1])) for a in o.pool]
    return {"name": "pool", "type": "STATIC", "connect_timeout": "2s",
            "load_balancing_policy": {"policies": [override_host]},
            "load_assignment": _endpoints("pool", addrs)}


def _epp_cluster(o: EnvoyOptions, epp_port: int) -> dict[str, Any]:
    cluster: dict[str, Any] = {
        "name": "epp", "type": "STATIC", "connect_timeout": "2s",
        "typed_extension_protocol_options": {
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
                "@type": _T + "extensions.upstreams.http.v3.HttpProtocolOptions",
                "explicit_http_config": {"http2_protocol_options": {}}}},
        "load_assignment": _endpoints("epp", [(o.epp_host, epp_port)]),
    }
    if o.epp_tls:  # TLS without a validation context: the picker's certificate is self-signed
        cluster["transport_socket"] = {
            "name": "envoy.transport_sockets.tls",
            "typed_config": {"@type": _T + "extensions.transport_sockets.tls.v3"
                                           ".UpstreamTlsContext",
                             "common_tls_context": {"validation_context": {}}}}
    return cluster


def envoy_bootstrap(listen_port: int, admin_port: int, epp_port: int,
                    options: EnvoyOptions | None = None,
                    host: str = "127.0.0.1") -> dict[str, Any]:
    o = options or EnvoyOptions()
    route: dict[str, Any] = {"cluster": "pool", "timeout": "300s"}
    if o.lb == "override-host":
        route["retry_policy"] = {"retry_on": "connect-failure,reset,refused-stream",
                                 "num_retries": o.num_retries}
    added = [{"header": {"key": SERVED, "value": "%UPSTREAM_REMOTE_ADDRESS%"}}]
    if o.debug_headers:
        added += [{"header": {"key": DEBUG_SERVED, "value": "%UPSTREAM_REMOTE_ADDRESS%"}},
                  {"header": {"key": DEBUG_PICKED, "value": f"%REQ({DESTINATION})%"}}]
    hcm = {
        "@type": _T + "extensions.filters.network.http_connection_manager.v3"
                      ".HttpConnectionManager",
        "stat_prefix": "gateway",
        "route_config": {"virtual_hosts": [{
            "name": "all", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": route,
                        "response_headers_to_add": added}]}]},
        "http_filters": [
            # a client's own pick header never reaches the cluster (fail-open included)
            {"name": "envoy.filters.http.header_mutation", "typed_config": {
                "@type": _T + "extensions.filters.http.header_mutation.v3.HeaderMutation",
                "mutations": {"request_mutations": [{"remove": DESTINATION}]}}},
            {"name": "envoy.filters.http.ext_proc", "typed_config": _ext_proc(o)},
            {"name": "envoy.filters.http.router",
             "typed_config": {"@type": _T + "extensions.filters.http.router.v3.Router"}},
        ],
    }
    listener = {"name": "gateway", "address": _socket(host, listen_port),
                "filter_chains": [{"filters": [{
                    "name": "envoy.filters.network.http_connection_manager",
                    "typed_config": hcm}]}]}
    return {
        "static_resources": {"listeners": [listener],
                             "clusters": [_pool_cluster(o), _epp_cluster(o, epp_port)]},
        "admin": {"address": _socket(host, admin_port)},
    }
