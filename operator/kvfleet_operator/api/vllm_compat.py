"""What the vLLM a pool runs accepts, checked before anything starts. Pure, no vLLM import.

Public API:

- `VLLM_VERSION`, `VLLM_IMAGE`: the vLLM release kvfleet renders arguments for and tests
  against (`make test-vllm`), and its image (`vllm/vllm-openai:v<VLLM_VERSION>`).
- `image_version(image) -> str | None`: the vLLM version an image names (`v0.32.0` tags
  of a repository whose name contains "vllm"); None for anything else (digests,
  `latest`, custom images).
- `known_flags(version) -> dict[str, bool] | None`: vLLM's OpenAI-server option flags
  (True: takes a value), for a version we hold a list for (`vllm_flags.json`, extracted
  from vLLM's own parser by tests/vllm/extract_vllm_flags.py; same major.minor counts).
- `unknown_flags(args, flags) -> list[str]`: the flags in `args` that parser lacks.
- `is_cpu_image(image) -> bool`: the image is a build of vLLM's CPU backend (its name says
  `cpu`: `vllm-cpu-release-repo`, `vllm-openai-cpu`). That is the device marker the spec
  carries; a pool's `gpus: 0` is not one (it is the default of every role, and kind vllm
  is the default engine). A runtime that knows better passes `device=`.
- `check_vllm_engine(engine, device=None)`: raises UnservableSpecError (the pool goes
  Degraded, never starts) for a CPU target (`device="cpu"`, or a CPU image) with a block
  size that is not a multiple of 32 (vLLM's CPU attention dies ~90 s into start-up
  otherwise), and for `engine.args` flags unknown to the vLLM version the image names
  (nothing is checked when that version is unknown).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Protocol

from kvfleet_operator.api.errors import UnservableSpecError


class EngineFields(Protocol):
    """What the check reads of `spec.engine` (so this module needs nothing from `spec`)."""

    @property
    def kind(self) -> str: ...
    @property
    def image(self) -> str | None: ...
    @property
    def block_size(self) -> int: ...
    @property
    def args(self) -> Sequence[str]: ...

VLLM_VERSION = "0.32.0"
VLLM_IMAGE = f"vllm/vllm-openai:v{VLLM_VERSION}"
CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention backend (CPU_ATTN) needs block_size % 32 == 0
_FLAGS_FILE = Path(__file__).with_name("vllm_flags.json")
_TAG = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)(?:[.+-].*)?$")


def image_version(image: str | None) -> str | None:
    if image is None:
        return VLLM_VERSION  # the default image
    name, _, tag = image.rpartition(":")
    if "@" in image or "/" in tag or "vllm" not in name.rsplit("/", 1)[-1]:
        return None
    m = _TAG.match(tag)
    return ".".join(m.groups()) if m else None


@cache
def _flag_table() -> tuple[str, dict[str, bool]]:
    data = json.loads(_FLAGS_FILE.read_text())
    return str(data["version"]), {str(k): bool(v) for k, v in data["flags"].items()}


def known_flags(version: str | None) -> dict[str, bool] | None:
    if version is None:
        return None
    held, flags = _flag_table()
    return flags if version.split(".")[:2] == held.split(".")[:2] else None


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def unknown_flags(args: list[str], flags: dict[str, bool]) -> list[str]:
    """Flags vLLM's parser would reject. Understands `--flag=value`, `--flag value`,
    underscores for dashes, `--json-flag.key value` and `-O3` (vLLM's FlexibleArgumentParser
    accepts all of them)."""
    unknown: list[str] = []
    expects_value = False
    for token in args:
        if expects_value and not (token.startswith("-") and not _is_number(token)):
            expects_value = False
            continue
        expects_value = False
        if not token.startswith("-") or _is_number(token):
            continue  # a positional or a value
        name, has_value, _ = token.partition("=")
        if name.startswith("--"):
            name = "--" + name[2:].replace("_", "-")
            name = name.split(".", 1)[0]
        elif name.startswith("-O"):  # -O3, -O=3, -O 3: --optimization-level
            if name == "-O" and not has_value:
                expects_value = True
            continue
        if name not in flags:
            unknown.append(name)
            continue
        expects_value = flags[name] and not has_value
    return unknown


def is_cpu_image(image: str | None) -> bool:
    if not image:
        return False
    name = image.split("@", 1)[0].rsplit("/", 1)[-1].split(":", 1)[0]
    return "cpu" in name.lower()


def check_vllm_engine(e: EngineFields, device: str | None = None) -> None:
    if e.kind != "vllm":
        return
    is_cpu = device == "cpu" if device is not None else is_cpu_image(e.image)
    if is_cpu and e.block_size % CPU_BLOCK_MULTIPLE:
        raise UnservableSpecError(
            "engine.blockSize",
            f"{e.block_size} cannot run on vLLM's CPU backend (its attention needs a "
            f"multiple of {CPU_BLOCK_MULTIPLE}; the replica would die during start-up)",
        )
    version = image_version(e.image)
    flags = known_flags(version)
    if flags is None:
        return
    bad = unknown_flags(list(e.args), flags)
    if bad:
        raise UnservableSpecError(
            "engine.args",
            f"vLLM {version} does not know {', '.join(bad)} (its server would exit at "
            "start-up); remove it or pin an image that has it",
        )
