"""`kvfleet engine`: serve one engine replica (OpenAI API, vLLM metrics, KV events, P/D).

Bad flags or a model that cannot be loaded end with one line on stderr and exit 2.
With KVFLEET_ENGINE_TOKEN set, /v1/kv_events and /v1/kv_transfer/* need that bearer token
(KV events carry prompt token ids), and this replica sends it when pulling KV.
"""

from __future__ import annotations

import argparse
import logging
import sys

from kvfleet_engine.contract import ROLES
from kvfleet_engine.contract.http_limits import (
    DEFAULT_BODY_READ_TIMEOUT_S,
    DEFAULT_ENGINE_MAX_UPLOADS_PER_CLIENT,
)

RUNNERS = ("torch", "simulated")


class CLIError(Exception):
    """A one-line, user-facing reason to stop."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CLIError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="kvfleet engine", description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None,
                   help="built-in name (tiny-random, smollm2-135m), .gguf file, or HF folder")
    p.add_argument("--runner", choices=RUNNERS, default="torch")
    p.add_argument("--profile", default=None,
                   help="cost-model profile for --runner simulated (e.g. cpu-tiny, h100-llama3-8b)")
    p.add_argument("--role", choices=ROLES, default="unified")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--advertise-host", default=None,
                   help="address decoders use to pull KV from this replica (default: --host, "
                        "or this machine's address when --host is a wildcard)")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed)")
    p.add_argument("--served-model-name", action="extend", nargs="+", default=None,
                   help="name(s) clients use, as in vLLM; defaults to --model")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=512)
    p.add_argument("--num-blocks", type=int, default=None,
                   help="KV blocks, incl. reserved block 0 (default 512, or the profile's)")
    p.add_argument("--block-size", type=int, default=None, help="default 16, or the profile's")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="default: the smaller of the model's context, 2048 and the KV capacity")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=True,
                   help="reuse KV of shared prompt prefixes (vLLM's flag)")
    p.add_argument("--max-queue", type=int, default=256,
                   help="requests admitted beyond --max-num-seqs before 503")
    p.add_argument("--max-body-bytes", type=int, default=1 << 20)
    p.add_argument("--body-read-timeout", type=float, default=DEFAULT_BODY_READ_TIMEOUT_S,
                   help="seconds a request body may take to arrive (then 408)")
    p.add_argument("--max-uploads-per-client", type=int,
                   default=DEFAULT_ENGINE_MAX_UPLOADS_PER_CLIENT,
                   help="request bodies one client address may have unfinished at once "
                        "(then 429); a router in front counts as one client")
    p.add_argument("--drain-timeout", type=float, default=30.0, help="seconds, after SIGTERM")
    p.add_argument("--fault-error-rate", type=float, default=0.0,
                   help="answer HTTP 500 to this share of completion requests, evenly spread "
                        "(to rehearse a bad revision's rollback); 0 = never")
    p.add_argument("--kv-handle-ttl", type=float, default=60.0,
                   help="seconds a prefill keeps KV for an unclaimed decoder")
    p.add_argument("--kv-transfer-timeout", type=float, default=30.0,
                   help="seconds a decoder waits for a prefill replica's KV")
    p.add_argument("--peer-fetch-timeout", type=float, default=5.0,
                   help="seconds a request waits for a peer's cached prefix (kv_transfer_params."
                        "peer_prefix) before computing it instead")
    p.add_argument("--kv-export-max-bytes", type=int, default=256 << 20,
                   help="KV payload bytes one /v1/kv_cache/export answer may carry (the run "
                        "is cut to fit); also the most a peer-prefix fetch reads")
    p.add_argument("--dtype", default="float32", help="torch runner weights/KV dtype")
    p.add_argument("--seed", type=int, default=None, help="sampler seed for unseeded requests")
    p.add_argument("--log-level", default="WARNING")
    return p


def main(argv: list[str]) -> int:
    try:
        args = build_parser().parse_args(argv)
        logging.basicConfig(level=args.log_level.upper(),
                            format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from kvfleet_engine.server.build import build_server_parts

        engine, tokenizer, settings = build_server_parts(args)
    except CLIError as exc:
        print(f"kvfleet engine: {exc}", file=sys.stderr)
        return 2
    except ValueError as exc:  # configs and loaders report bad values as ValueError
        print(f"kvfleet engine: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. an unreadable model file
        print(f"kvfleet engine: {exc}", file=sys.stderr)
        return 2
    from kvfleet_engine.server.serve import serve

    try:
        return serve(engine, tokenizer, settings)
    except OSError as exc:  # e.g. the port is taken
        print(f"kvfleet engine: cannot serve on {settings.host}:{settings.port}: {exc.strerror}",
              file=sys.stderr)
        return 1
