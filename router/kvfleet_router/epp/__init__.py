"""The router's second front: a Gateway API Inference Extension (GIE) Endpoint Picker.

A gateway (Envoy, Istio, kgateway, Envoy Gateway, GKE) sends each inference request's
headers and body over Envoy's `ext_proc` gRPC stream; the picker answers with the pod
that should serve it, and the gateway proxies the bytes itself. The choice comes from the
same RouterCore, Dispatcher (hold queue, saturation) and HealthFeedback as the HTTP
front's; nothing here scores or filters on its own.

* options.py:  EppOptions (no gRPC import: the CLI and app.py read it without the extra).
* protocol.py: the GIE names and the ext_proc messages built from them.
* exchange.py: one ext_proc stream, header -> body -> trailer, as a state machine.
* server.py:   the grpc.aio server: ExternalProcessor, health services, TLS.
* tls.py:      a self-signed certificate when none is given (as GIE's reference picker).

Run it with `kvfleet router --epp-port 9002` (needs the `epp` extra: grpcio,
grpcio-health-checking, xds-protos, cryptography).
"""
