"""Turn `kvfleet engine` flags into an engine, its tokenizer and the server's settings.

Loaders and configs raise ValueError with a one-line reason; the CLI prints it.
"""

from __future__ import annotations

import argparse
import os
import socket
from typing import Any

from kvfleet_engine import contract
from kvfleet_engine.core.config import EngineConfig
from kvfleet_engine.server.state import ServerSettings

DEFAULT_MAX_MODEL_LEN = 2048
DEFAULT_NUM_BLOCKS = 512  # torch runner; a simulated profile brings its own
DEFAULT_BLOCK_SIZE = 16
# Env, not a flag: a secret on the command line shows in `ps`. Same value on every replica.
INTERNAL_TOKEN_ENV = contract.ENGINE_TOKEN_ENV


def build_server_parts(args: argparse.Namespace) -> tuple[Any, Any, ServerSettings]:
    _check_flags(args)
    if args.runner == "simulated":
        from kvfleet_engine.runners.cost_model import load_profile

        profile = load_profile(args.profile or args.model)
        args.num_blocks = args.num_blocks or profile.num_gpu_blocks
        args.block_size = args.block_size or profile.block_size
    args.num_blocks = args.num_blocks or DEFAULT_NUM_BLOCKS
    args.block_size = args.block_size or DEFAULT_BLOCK_SIZE
    _check_sizes(args)
    if args.runner == "torch":
        runner, tokenizer, model_len, default_name = _torch_parts(args)
    else:
        runner, tokenizer, model_len, default_name = _simulated_parts(args)
    capacity = (args.num_blocks - 1) * args.block_size
    max_model_len = args.max_model_len or min(model_len, DEFAULT_MAX_MODEL_LEN, capacity)
    config = EngineConfig(
        num_blocks=args.num_blocks,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=max_model_len,
        enable_prefix_caching=args.enable_prefix_caching,
    )
    from kvfleet_engine.core.engine import LLMEngine

    engine = LLMEngine(config, runner, tokenizer=tokenizer)
    settings = ServerSettings(
        served_model_names=args.served_model_name or [default_name],
        max_model_len=max_model_len,
        vocab_size=int(tokenizer.vocab_size),
        block_size=args.block_size,
        role=args.role,
        host=args.host,
        advertise_host=args.advertise_host or _default_advertise_host(args.host),
        port=args.port,
        max_num_seqs=args.max_num_seqs,
        max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes,
        body_read_timeout_s=args.body_read_timeout,
        max_uploads_per_client=args.max_uploads_per_client,
        drain_timeout_s=args.drain_timeout,
        fault_error_rate=args.fault_error_rate,
        kv_handle_ttl_s=args.kv_handle_ttl,
        kv_transfer_timeout_s=args.kv_transfer_timeout,
        peer_fetch_timeout_s=args.peer_fetch_timeout,
        kv_export_max_bytes=args.kv_export_max_bytes,
        enable_prefix_caching=args.enable_prefix_caching,
        internal_token=os.environ.get(INTERNAL_TOKEN_ENV, ""),
    )
    return engine, tokenizer, settings


def _default_advertise_host(host: str) -> str:
    """A wildcard bind address is no address to dial: use this machine's (e.g. a pod IP)."""
    if host not in ("", "0.0.0.0", "::"):
        return host
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _check_flags(args: argparse.Namespace) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    for flag in ("max_num_seqs", "max_num_batched_tokens", "max_body_bytes",
                 "max_uploads_per_client"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise ValueError("--max-model-len must be at least 2")
    if args.max_queue < 0:
        raise ValueError("--max-queue must be >= 0")
    if args.drain_timeout < 0:
        raise ValueError("--drain-timeout must be >= 0")
    if not 0 <= args.fault_error_rate <= 1:
        raise ValueError("--fault-error-rate must be in [0, 1]")
    if not 0 < args.body_read_timeout <= 3600:
        raise ValueError("--body-read-timeout must be in (0, 3600] seconds")
    if args.kv_handle_ttl <= 0 or args.kv_transfer_timeout <= 0 or args.peer_fetch_timeout <= 0:
        raise ValueError("--kv-handle-ttl, --kv-transfer-timeout and --peer-fetch-timeout must "
                         "be positive")
    if args.kv_export_max_bytes < 1:
        raise ValueError("--kv-export-max-bytes must be at least 1")
    if args.runner == "torch":
        if not args.model:
            raise ValueError("--model is required with --runner torch")
        if args.profile:
            raise ValueError("--profile only applies to --runner simulated")
    elif not (args.profile or args.model):
        raise ValueError("--runner simulated needs --profile (or --model naming a profile)")


def _check_sizes(args: argparse.Namespace) -> None:
    if args.block_size < 1:
        raise ValueError("--block-size must be at least 1")
    if args.num_blocks < 2:
        raise ValueError("--num-blocks must be at least 2 (block 0 is reserved)")


def _torch_parts(args: argparse.Namespace) -> tuple[Any, Any, int, str]:
    from kvfleet_engine.model import registry
    from kvfleet_engine.runners.torch_runner import TorchRunner

    loaded = registry.load(args.model, dtype=args.dtype)
    runner = TorchRunner(loaded.model, args.num_blocks, args.block_size, seed=args.seed)
    return runner, loaded.tokenizer, loaded.config.max_position_embeddings, args.model


def _simulated_parts(args: argparse.Namespace) -> tuple[Any, Any, int, str]:
    from kvfleet_engine.model.tokenizer import ByteTokenizer
    from kvfleet_engine.runners import sim_runner

    name = args.profile or args.model
    # Byte-level ids keep simulated output printable text; the profile sets only timing.
    runner = sim_runner.build_simulated_runner(name, args.num_blocks, args.block_size,
                                               seed=args.seed, vocab_size=ByteTokenizer.VOCAB_SIZE)
    return runner, ByteTokenizer(), DEFAULT_MAX_MODEL_LEN * 64, args.model or name
