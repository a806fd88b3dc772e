"""`kvfleet router --config router.yaml --host 127.0.0.1 --port N --admin-token-file F`

The config file (see config.py) may list static endpoints; without --config the router
starts empty (version 0) and waits for the operator's first push to /admin/config.

`--epp-port P` also serves the same routing core as a Gateway API Inference Extension
Endpoint Picker (Envoy ext_proc over gRPC, TLS with a self-signed certificate unless
--epp-cert-file/--epp-key-file or --epp-insecure) on P. The HTTP port keeps /admin,
/health and /metrics (and the OpenAI API), so the operator programs a picker exactly as
it programs a router. It needs the `epp` extra (grpcio, grpcio-health-checking,
xds-protos, cryptography).
The admin token comes from --admin-token-file, else from $KVFLEET_ADMIN_TOKEN; without
either, /admin answers 401 to everyone. `--api-keys-file F` maps client API keys to tenants
(api_keys.py): completions then need `Authorization: Bearer <key>`.
A bad config or flag is one line and exit code 2.

`--workers N` (1..64, default 1) runs N router processes on the one port (SO_REUSEPORT,
Linux), under this process as their supervisor (workers.py); they share routing state
over their private loopback ports (exchange.py). `--worker-index`, `--exchange-listen` and
`--exchange-siblings` are what the supervisor gives each worker, not for people.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Callable

from kvfleet_router.api_keys import ApiKeys
from kvfleet_router.config import ConfigError, RouterConfig, load_file
from kvfleet_router.epp.options import EppOptions
from kvfleet_router.exchange_seed import ensure_hash_seed
from kvfleet_router.workers import (
    MAX_WORKERS,
    parse_listen,
    parse_siblings,
    reuse_port_problem,
)

TOKEN_ENV = "KVFLEET_ADMIN_TOKEN"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"kvfleet router: {message}", file=sys.stderr)
        raise SystemExit(2)


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = _Parser(prog="kvfleet router",
                description="Run the cache-aware router in front of engine replicas.")
    p.add_argument("--config", help="router config YAML/JSON (see kvfleet_router.config)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--admin-token-file", help=f"file holding the admin bearer token "
                   f"(default: ${TOKEN_ENV})")
    p.add_argument("--api-keys-file", help="YAML mapping of client API key to tenant "
                   "(api_keys.py; a mounted Secret on Kubernetes): clients must then send "
                   "Authorization: Bearer <key>, else 401")
    p.add_argument("--stop-delay-s", type=float, default=0.0,
                   help="after SIGTERM, keep serving this long (0..300 s) with /health at 503 "
                   "before closing the port, so a balancer's health check takes the router "
                   "out first (default 0: on Kubernetes the pod's preStop sleep does this)")
    p.add_argument("--log-level", default="warning",
                   choices=["debug", "info", "warning", "error"])
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help=f"router processes sharing --port (SO_REUSEPORT, Linux; 1..{MAX_WORKERS}, "
                   "default 1): one per core the pod is given")
    w = p.add_argument_group("set by --workers for each worker (internal)")
    w.add_argument("--worker-index", type=int, metavar="I",
                   help="this worker's index: bind --port with SO_REUSEPORT beside its "
                   "siblings; the supervisor says where it listens")
    w.add_argument("--exchange-listen", metavar="HOST:PORT",
                   help="also serve on this private address (siblings reach it there)")
    w.add_argument("--exchange-siblings", metavar="URL,...", default="",
                   help="the other workers' private base URLs (always exchange peers)")
    g = p.add_argument_group("endpoint picker (GIE ext_proc front)")
    g.add_argument("--epp-port", type=int, help="serve ext_proc gRPC on this port")
    g.add_argument("--epp-host", help="address for --epp-port (default: --host)")
    g.add_argument("--epp-cert-file", help="TLS certificate PEM (default: self-signed)")
    g.add_argument("--epp-key-file", help="TLS private key PEM, with --epp-cert-file")
    g.add_argument("--epp-insecure", action="store_true",
                   help="plaintext gRPC (tests, or a mesh that adds mTLS itself)")
    g.add_argument("--epp-fallbacks", type=int, default=0,
                   help="ordered fallback endpoints after the primary (default 0; the "
                   "gateway must honour a list, e.g. Envoy's override_host policy)")
    return p.parse_args(argv)


def epp_options(args: argparse.Namespace) -> EppOptions | None:
    if args.epp_port is None:
        for flag in ("epp_host", "epp_cert_file", "epp_key_file"):
            if getattr(args, flag):
                raise ConfigError(f"--{flag.replace('_', '-')} needs --epp-port")
        return None
    try:
        opts = EppOptions(args.epp_port, args.epp_host or args.host, args.epp_cert_file,
                          args.epp_key_file, args.epp_insecure, args.epp_fallbacks)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    try:
        import grpc  # noqa: F401
        from envoy.service.ext_proc.v3 import external_processor_pb2  # noqa: F401
        from grpc_health.v1 import health  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"--epp-port needs the `epp` extra (pip install 'kvfleet[epp]'): "
                          f"{exc}") from None
    return opts


def read_token(path: str | None) -> str | None:
    if path:
        try:
            with open(path, encoding="utf-8") as fh:
                token = fh.read().strip()
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read admin token: {exc.strerror}") from None
        if not token:
            raise ConfigError(f"{path}: admin token file is empty")
        return token
    return os.environ.get(TOKEN_ENV) or None


def raise_fd_limit() -> None:
    """Thousands of streams need two sockets each; lift the soft limit to the hard one."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


def new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def worker_flags(args: argparse.Namespace) -> tuple[tuple[str, int] | None, list[str]]:
    """Check --workers and the flags it gives each worker: (private address, siblings)."""
    if not 1 <= args.workers <= MAX_WORKERS:
        raise ConfigError(f"--workers {args.workers}: must be 1..{MAX_WORKERS}")
    if args.worker_index is not None and not 0 <= args.worker_index < MAX_WORKERS:
        raise ConfigError(f"--worker-index {args.worker_index}: must be 0..{MAX_WORKERS - 1}")
    if args.workers > 1 or args.worker_index is not None:
        problem = reuse_port_problem()
        if problem:
            raise ConfigError(problem)
        if args.epp_port is not None:  # gRPC's server does not share its port
            raise ConfigError("--epp-port runs in one process: use --workers 1")
    try:
        private = parse_listen(args.exchange_listen) if args.exchange_listen else None
        siblings = parse_siblings(args.exchange_siblings)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    return private, siblings


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_file(args.config) if args.config else RouterConfig()
        token = read_token(args.admin_token_file)
        epp = epp_options(args)
        keys = ApiKeys(args.api_keys_file) if args.api_keys_file else None
        private, siblings = worker_flags(args)
    except ConfigError as exc:
        print(f"kvfleet router: {exc}", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"kvfleet router: --port {args.port} is out of range", file=sys.stderr)
        return 2
    if not 0 <= args.stop_delay_s <= 300:  # also refuses nan
        print(f"kvfleet router: --stop-delay-s {args.stop_delay_s} is not in 0..300",
              file=sys.stderr)
        return 2
    # before any socket or worker: the workers inherit the pool's hash seed
    ensure_hash_seed(token, argv)
    is_worker = args.worker_index is not None
    if token is None and not is_worker:
        logging.getLogger("kvfleet_router").warning(
            "no admin token configured: /admin answers 401%s",
            "; the workers cannot share state" if args.workers > 1 else "")

    def say_listening() -> None:
        admin = "admin API behind a bearer token" if token else "admin API disabled (no token)"
        if keys is not None:
            admin += f"; {len(keys)} client API key(s)"
        workers = f"{args.workers} workers, " if args.workers > 1 else ""
        print(f"kvfleet router listening on http://{args.host}:{args.port} "
              f"({workers}policy {cfg.policy.name}, {len(cfg.endpoints)} endpoint(s), "
              f"config version {cfg.version}; {admin})", flush=True)
        if epp is not None:
            tls = "plaintext" if epp.is_insecure else \
                "TLS" if epp.cert_file else "TLS, self-signed"
            print(f"kvfleet endpoint picker (ext_proc) on {epp.host}:{epp.port} ({tls}, "
                  f"{epp.num_fallbacks} fallback(s))", flush=True)

    if args.workers > 1:
        return run_supervisor(args, argv, say_listening)
    from kvfleet_router.app import RouterApp
    from kvfleet_router.http_protocol import serve
    from kvfleet_router.workers import worker_app

    raise_fd_limit()
    loop = new_loop()
    asyncio.set_event_loop(loop)
    pod = siblings  # /metrics answers for the whole pod, token or not (worker_views.py)
    if token is None:
        siblings = []  # the exchange and the config relay need the token: route alone
    app = RouterApp(cfg, token, epp, keys, exchange_siblings=siblings)
    webapp = worker_app(app, token, pod, private=private, index=args.worker_index or 0) \
        if is_worker else app.build()
    try:
        # a worker is quiet: its supervisor says where the pod listens
        loop.run_until_complete(serve(webapp, args.host, args.port,
                                      (lambda: None) if is_worker else say_listening,
                                      reuse_port=is_worker, private=private,
                                      stop_delay_s=args.stop_delay_s,
                                      on_stop=app.status.begin_stopping))
    except OSError as exc:
        print(f"kvfleet router: {cannot_listen(args.host, args.port, exc)}", file=sys.stderr)
        return 1
    return 0


def cannot_listen(host: str, port: int, exc: OSError) -> str:
    return f"cannot listen on {host}:{port}: {exc.strerror}" if exc.strerror else str(exc)


def run_supervisor(args: argparse.Namespace, argv: list[str],
                   say_listening: Callable[[], None]) -> int:
    from kvfleet_router.workers import check_public_bind, supervise

    try:
        check_public_bind(args.host, args.port)
    except OSError as exc:
        print(f"kvfleet router: {cannot_listen(args.host, args.port, exc)}", file=sys.stderr)
        return 1
    return supervise(argv, args.workers, say_listening)
