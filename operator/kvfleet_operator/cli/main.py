"""The `kvfleet` console script: one entry point, one subcommand per room.

Each subcommand lives in the package that owns it and exposes `main(argv) -> int`.
The dispatcher imports it lazily, so `kvfleet --help` stays fast. Only subcommands that
exist are listed.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module with main(argv), one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "up": ("kvfleet_operator.cli.up", "run a whole InferencePool as local processes"),
    "status": ("kvfleet_operator.cli.status_cmd",
               "show the state of a local fleet started by `up`"),
    "engine": ("kvfleet_engine.cli", "serve one engine replica (OpenAI API, vLLM metrics)"),
    "router": ("kvfleet_router.cli", "run the cache-aware router in front of engine replicas"),
    "operator": ("kvfleet_operator.cli.operator_cmd",
                 "Kubernetes: `run` the operator, or `render` a pool's child manifests"),
    "sim": ("kvfleet_sim.cli", "replay a trace through a simulated fleet in virtual time"),
}


def usage() -> str:
    lines = ["usage: kvfleet <command> [options]", "", "commands:"]
    lines += [f"  {name:<9} {text}" for name, (_, text) in SUBCOMMANDS.items()]
    lines += ["", "Run `kvfleet <command> --help` for a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from importlib.metadata import version

        print(f"kvfleet {version('kvfleet')}")
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"kvfleet: unknown command {name!r}; see `kvfleet --help`", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    try:
        return int(module.main(rest) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
