"""`kvfleet operator run`: kopf with kvfleet's handlers, until SIGINT/SIGTERM.

Credentials come from the in-cluster service account, else the kubeconfig (`KUBECONFIG`,
`~/.kube/config`), for kopf (its `login_via_client`) and kvfleet's client alike. kopf runs
standalone: no peering objects, so exactly one operator replica may run (see
`operator_manifests.build_operator_deployment`: `replicas: 1`, `strategy: Recreate`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any
from urllib.parse import urlsplit

from kvfleet_operator.runtimes.kubernetes.build.options import (
    KVFLEET_IMAGE,
    OPERATOR_NAMESPACE,
    BuildOptions,
)
from kvfleet_operator.runtimes.kubernetes.operator_config import OperatorConfig


def add_build_options(parser: argparse.ArgumentParser) -> None:
    """The build inputs `run` and `render` share."""
    parser.add_argument("--image", default=KVFLEET_IMAGE,
                        help=f"kvfleet's image for routers and builtin engines (default: "
                        f"{KVFLEET_IMAGE}, not published yet)")
    parser.add_argument("--hf-token-secret", metavar="NAME",
                        help="a Secret with key `token` in the pool's namespace holding the "
                        "HF token for hf:// models")
    parser.add_argument("--operator-namespace", metavar="NS",
                        default=os.environ.get("POD_NAMESPACE") or OPERATOR_NAMESPACE,
                        help="the namespace the operator runs in: every pool's engine "
                        "NetworkPolicy admits its health checks and scrapes from there "
                        f"(default: $POD_NAMESPACE, else {OPERATOR_NAMESPACE})")


def add_run_parser(sub: Any) -> None:
    r = sub.add_parser("run", help="run the operator (kopf) until interrupted",
                       description="Reconcile InferencePools into Deployments, Services and a "
                       "programmed router, and run each pool's control loop. Exactly one "
                       "replica may run (no leader election): in a cluster, a Deployment with "
                       "replicas 1 and strategy Recreate.")  # fmt: skip
    where = r.add_mutually_exclusive_group(required=True)
    where.add_argument("--namespace", "-n", action="append", metavar="NS",
                       help="watch this namespace (repeatable)")
    where.add_argument("--all-namespaces", "-A", action="store_true",
                       help="watch every namespace (needs cluster-wide RBAC)")
    r.add_argument("--liveness", metavar="URL",
                   help="serve kopf's liveness probe, e.g. http://0.0.0.0:8080/healthz")
    add_build_options(r)
    r.add_argument("--prometheus", metavar="URL",
                   help="read engine metrics from this Prometheus instead of scraping pods")
    r.add_argument("--metrics-port", type=_port, metavar="PORT",
                   help="serve the operator's /metrics (every pool's control-loop series) "
                   "on this port, all addresses")
    r.add_argument("--max-tick", type=_positive, default=5.0, metavar="SECONDS",
                   help="tick each pool's loop at least this often (default 5; the scaler "
                   "still decides every autoscaling.intervalSeconds)")
    r.add_argument("--verbose", "-v", action="store_true", help="debug logging")


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"not a port: {text}")
    return value


def config_from(args: argparse.Namespace) -> OperatorConfig:
    options = BuildOptions(hf_token_secret=args.hf_token_secret,
                           operator_namespace=args.operator_namespace)  # fmt: skip
    return OperatorConfig(image=args.image, prometheus_url=args.prometheus,
                          max_tick_s=args.max_tick, metrics_port=args.metrics_port,
                          options=options)  # fmt: skip


async def operate(args: argparse.Namespace, stop_flag: asyncio.Event | None = None) -> None:
    import kopf

    from kvfleet_operator.runtimes.kubernetes import handlers
    registry = handlers.register(kopf.OperatorRegistry())
    await kopf.operator(
        registry=registry, standalone=True, clusterwide=bool(args.all_namespaces),
        namespaces=list(args.namespace or ()), liveness_endpoint=args.liveness,
        memo=kopf.Memo(config=config_from(args)), stop_flag=stop_flag,
    )  # fmt: skip


def ports_taken(args: argparse.Namespace) -> str | None:
    """A one-line reason when --liveness or --metrics-port cannot be served (kopf would log
    a traceback for the first and retry the second forever)."""
    from kvfleet_operator.runtimes.kubernetes.handlers import METRICS_HOST
    from kvfleet_operator.runtimes.local.procs import listen_error

    if args.liveness:
        url = urlsplit(args.liveness)
        error = listen_error(url.port or 80, url.hostname or "0.0.0.0")  # noqa: S104 - kopf's default
        if error:
            return f"--liveness {args.liveness}: cannot listen: {error}"
    if args.metrics_port is not None:
        error = listen_error(args.metrics_port, METRICS_HOST)
        if error:
            return f"--metrics-port {args.metrics_port}: cannot listen on {METRICS_HOST}: {error}"
    return None


def run(args: argparse.Namespace) -> int:
    import kopf

    from kvfleet_operator.runtimes.kubernetes.ports.kube_client import (
        CredentialsError,
        load_configuration,
    )

    try:  # said before kopf starts, which would log tracebacks and retry forever
        problem = ports_taken(args)
        if problem is None:
            asyncio.run(load_configuration())
    except CredentialsError as exc:
        problem = str(exc)
    if problem:
        print(f"kvfleet operator run: {problem}", file=sys.stderr)
        return 1
    kopf.configure(debug=args.verbose, verbose=args.verbose, log_format=kopf.LogFormat.PLAIN)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
    try:
        asyncio.run(operate(args))
    except KeyboardInterrupt:
        return 130
    # kopf's ActivityError (not public): a startup handler gave up, e.g. on the metrics
    # port or the credentials, lost since the check above
    except Exception as exc:
        if not isinstance(exc.__cause__, kopf.PermanentError):
            raise
        print(f"kvfleet operator run: {exc.__cause__}", file=sys.stderr)
        return 1
    return 0
