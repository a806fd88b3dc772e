"""`kvfleet router --config router.yaml --host 127.0.0.1 --port N --admin-token-file F`

The config file (see config.py) may list static endpoints; without --config the router
starts empty (version 0) and waits for the operator's first push to /admin/config.
The admin token comes from --admin-token-file, else from $KVFLEET_ADMIN_TOKEN; without
either, /admin answers 401 to everyone. A bad config or flag is one line and exit code 2.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

from kvfleet_router.config import ConfigError, RouterConfig, load_file

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
    p.add_argument("--log-level", default="warning",
                   choices=["debug", "info", "warning", "error"])
    return p.parse_args(argv)


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


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        cfg = load_file(args.config) if args.config else RouterConfig()
        token = read_token(args.admin_token_file)
    except ConfigError as exc:
        print(f"kvfleet router: {exc}", file=sys.stderr)
        return 2
    if not 0 < args.port < 65536:
        print(f"kvfleet router: --port {args.port} is out of range", file=sys.stderr)
        return 2
    if token is None:
        logging.getLogger("kvfleet_router").warning(
            "no admin token configured: /admin answers 401")
    from kvfleet_router.app import RouterApp
    from kvfleet_router.http_protocol import serve

    raise_fd_limit()
    loop = new_loop()
    asyncio.set_event_loop(loop)
    def say_listening() -> None:
        admin = "admin API behind a bearer token" if token else "admin API disabled (no token)"
        print(f"kvfleet router listening on http://{args.host}:{args.port} "
              f"(policy {cfg.policy.name}, {len(cfg.endpoints)} endpoint(s), "
              f"config version {cfg.version}; {admin})", flush=True)

    try:
        loop.run_until_complete(serve(RouterApp(cfg, token).build(), args.host, args.port,
                                      say_listening))
    except OSError as exc:
        print(f"kvfleet router: cannot listen on {args.host}:{args.port}: {exc.strerror}",
              file=sys.stderr)
        return 1
    return 0
