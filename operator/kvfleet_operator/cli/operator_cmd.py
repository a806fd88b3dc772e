"""`kvfleet operator`: `run` the kopf operator, or `render` a pool's children.

- `kvfleet operator run (--namespace NS ... | --all-namespaces) [--liveness URL]`: the
  operator (kopf, with `handlers.py`), out of cluster with your kubeconfig or in cluster
  with its service account. One active replica: kopf runs standalone (no peering), so run
  exactly one, as a Deployment with `replicas: 1` and `strategy: Recreate` (the old pod is
  gone before the new one starts).
- `kvfleet operator manifests [-n NS]`: the operator's own ServiceAccount, RBAC and
  Deployment (`operator_manifests.py`), for `kubectl apply -f -`.
- `kvfleet operator render pool.yaml [--namespace NS]`: print every child manifest the
  operator would own for a pool, as multi-document YAML, for review, `kubectl diff` and
  GitOps previews. Tokens are placeholders, never real secrets.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, TextIO

import yaml

from kvfleet_operator.api.errors import SpecError
from kvfleet_operator.api.pool import load_pool
from kvfleet_operator.runtimes.kubernetes.build.children import build_children
from kvfleet_operator.runtimes.kubernetes.build.operator_manifests import build_operator_manifests
from kvfleet_operator.runtimes.kubernetes.build.options import (
    KVFLEET_IMAGE,
    OPERATOR_NAMESPACE,
    BuildOptions,
    Tokens,
)
from kvfleet_operator.runtimes.kubernetes.run_cmd import add_build_options, add_run_parser, run

PLACEHOLDER_TOKEN = "PLACEHOLDER-generated-by-the-operator-not-a-secret"
PLACEHOLDER_TOKENS = Tokens(admin=PLACEHOLDER_TOKEN, engine=PLACEHOLDER_TOKEN)
# Owner references need the pool's uid, which only the cluster knows; pass --pool-uid for
# a clean `kubectl diff` against a live pool.
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"
PROG = "kvfleet operator"
COMMANDS = ("run", "render", "manifests")
USAGE_LINE = f"{PROG}: say `run`, `render` or `manifests`; see `kvfleet operator --help`"
SECRET_NOTE = ("# PLACEHOLDER token: the operator generates the real one and keeps it;\n"
               "# never apply this Secret as is (--without-secrets leaves it out).\n")


class RenderError(Exception):
    """A one-line reason, printed as `kvfleet operator render: ...`, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise RenderError(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="The Kubernetes operator: `run` it, or `render` the "
                "children it would own for a pool.")
    sub = p.add_subparsers(dest="command", metavar="{run,render,manifests}")
    add_run_parser(sub)
    m = sub.add_parser("manifests", help="print the operator's own manifests (ServiceAccount, "
                       "RBAC, a one-replica Deployment)", description="Print the operator's "
                       "ServiceAccount, ClusterRole, ClusterRoleBinding and Deployment "
                       "(replicas 1, strategy Recreate), for `kubectl apply -f -`.")
    m.add_argument("--namespace", "-n", default=OPERATOR_NAMESPACE,
                   help=f"where the operator runs (default {OPERATOR_NAMESPACE}; must exist)")
    m.add_argument("--image", default=KVFLEET_IMAGE, help=f"default {KVFLEET_IMAGE}")
    r = sub.add_parser("render", help="print the child manifests of a pool (multi-document "
                       "YAML)", description="Print every child manifest the operator would "
                       "own for a pool. Tokens are placeholders.")
    r.add_argument("pool", help="an InferencePool YAML file")
    r.add_argument("--namespace", "-n", help="the pool's namespace (default: its "
                   "metadata.namespace, else default)")
    r.add_argument("--pool-uid", help="the live pool's metadata.uid, for owner references "
                   f"(default: {PLACEHOLDER_UID})")
    add_build_options(r)
    r.add_argument("--without-secrets", action="store_true",
                   help="leave the two token Secrets out")
    return p


class _Dumper(yaml.SafeDumper):
    pass


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None  # preStop scripts and the router config
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(children: list[dict[str, Any]]) -> str:
    parts = []
    for child in children:
        note = SECRET_NOTE if child["kind"] == "Secret" else ""
        parts.append("---\n" + note + yaml.dump(child, Dumper=_Dumper, sort_keys=False))
    return "".join(parts)


def render(args: argparse.Namespace) -> list[dict[str, Any]]:
    try:
        pool = load_pool(args.pool)
    except SpecError as exc:
        text = str(exc)
        raise RenderError(text if str(args.pool) in text else f"{args.pool}: {text}") from None
    if args.namespace is not None:
        pool.namespace = args.namespace
    pool.uid = args.pool_uid or PLACEHOLDER_UID
    options = BuildOptions(hf_token_secret=args.hf_token_secret,
                           operator_namespace=args.operator_namespace)  # fmt: skip
    try:
        children = build_children(pool, tokens=PLACEHOLDER_TOKENS, image=args.image,
                                  options=options)
    except SpecError as exc:
        raise RenderError(f"{args.pool}: {exc}") from None
    if args.without_secrets:
        children = [c for c in children if c["kind"] != "Secret"]
    return children


def main(argv: list[str], out: TextIO | None = None) -> int:
    if not argv or argv[0] not in (*COMMANDS, "-h", "--help"):
        print(USAGE_LINE, file=sys.stderr)
        return 2
    try:
        try:
            args = _parser().parse_args(argv)
        except SystemExit as exc:  # --help
            return int(exc.code or 0)
        if args.command == "run":
            return run(args)
        if args.command == "manifests":
            text = to_yaml(build_operator_manifests(args.namespace, args.image))
        else:
            text = to_yaml(render(args))
    except RenderError as exc:
        print(f"{PROG} {argv[0]}: {exc}", file=sys.stderr)
        return 2
    (out or sys.stdout).write(text)
    return 0
