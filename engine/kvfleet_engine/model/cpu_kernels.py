"""Builds and loads kvfleet's fused CPU kernels (csrc/*.cpp) through ctypes.

The library is compiled once per source and CPU (a few seconds with g++) into a cache folder,
then loaded next to torch so that both share torch's OpenMP thread pool. Without a
compiler, or with KVFLEET_CPU_KERNELS=0, `load()` logs one warning, returns None and the
model runs the same layer with plain torch ops instead (slower, same results up to rounding).

Cache folder: $KVFLEET_KERNEL_DIR, else ~/.cache/kvfleet/kernels, else the temp folder
(for read-only home directories, as in the engine's container).
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import torch

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("kernels.cpp", "attention.cpp", "gemm.cpp")  # all include kernels.h
ABI_VERSION = 2
# -ffast-math only when compiling (it lets glibc's vector expf in). Linking with it would add
# crtfastmath.o, which turns on flush-to-zero for the whole process at load time and
# changes every float operation in it, torch's and Python's included.
COMPILE_FLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC", "-std=c++17"]
LINK_FLAGS = ["-shared", "-fopenmp"]
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}

_i64, _f32, _p = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p
SIGNATURES: dict[str, list[type]] = {
    "kvf_rms_norm": [ctypes.c_int, _p, _i64, _p, _p, _p, _i64, _i64, _f32],
    "kvf_silu_mul": [ctypes.c_int, _p, _p, _i64, _i64],
    "kvf_rope": [ctypes.c_int, _p, _i64, _i64, _i64, _i64, _p, _p, _p],
    "kvf_cache_write": [ctypes.c_int, _p, _p, _i64, _p, _p, _p, _i64, _i64],
    "kvf_pack_weight": [_p, _p, _i64, _i64],
    "kvf_packed_gemm": [_p, _p, _p, _p, _i64, _i64, _i64],
    "kvf_paged_attention": [ctypes.c_int, _p, _i64, _p, _i64, _p, _p, _p, _i64, _p, _p, _p,
                            _i64, _i64, _i64, _i64, _i64, _f32],
}


def _cpu_tag() -> str:
    """-march=native code runs only where it was built: key the cache by the CPU's flags."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        flags = next((ln for ln in info.splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return hashlib.sha256(f"{platform.machine()} {flags}".encode()).hexdigest()[:12]


def _cache_dirs() -> list[Path]:
    env = os.environ.get("KVFLEET_KERNEL_DIR")
    if env:
        return [Path(env)]
    return [Path.home() / ".cache" / "kvfleet" / "kernels",
            Path(tempfile.gettempdir()) / "kvfleet-kernels"]


def _build(compiler: str) -> Path:
    digest = hashlib.sha256(" ".join(COMPILE_FLAGS + LINK_FLAGS).encode())
    for name in (*SOURCES, "kernels.h"):
        digest.update((CSRC / name).read_bytes())
    key = digest.hexdigest()[:12]
    name = f"cpu_kernels-{key}-{_cpu_tag()}.so"
    errors = []
    for folder in _cache_dirs():
        target = folder / name
        if target.exists():
            return target
        try:
            folder.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(suffix=".building", dir=folder)
            os.close(fd)
        except OSError as e:
            errors.append(f"{folder}: {e}")
            continue
        log.info("compiling kvfleet CPU kernels into %s (once per source and CPU)", folder)
        objects = [f"{tmp}.{i}.o" for i in range(len(SOURCES))]
        try:
            for source, obj in zip(SOURCES, objects, strict=True):
                _run([compiler, *COMPILE_FLAGS, "-c", str(CSRC / source), "-o", obj])
            _run([compiler, *LINK_FLAGS, *objects, "-o", tmp, "-lm"])
            os.replace(tmp, target)  # atomic: concurrent builders never load half a file
            return target
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"{compiler} failed: {e.stderr.strip()[-500:] or e}") from e
        finally:
            for leftover in (tmp, *objects):
                if os.path.exists(leftover):
                    os.unlink(leftover)
    raise RuntimeError("no writable kernel cache folder: " + "; ".join(errors))


def _run(cmd: list[str]) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=300)


@cache
def load() -> ctypes.CDLL | None:
    """The kernel library, or None (plain torch ops) when disabled or not buildable."""
    if os.environ.get("KVFLEET_CPU_KERNELS", "1") == "0":
        log.warning("KVFLEET_CPU_KERNELS=0: the fused CPU kernels are off, the engine runs "
                    "plain torch ops (slower)")
        return None
    compiler = shutil.which(os.environ.get("CXX", "g++")) or shutil.which("c++")
    if compiler is None:
        log.warning("no C++ compiler found: the engine runs plain torch ops (slower)")
        return None
    try:
        lib = ctypes.CDLL(str(_build(compiler)))
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        log.warning("CPU kernels unavailable, running plain torch ops (slower): %s", e)
        return None
    if lib.kvf_abi_version() != ABI_VERSION:
        log.warning("CPU kernel library has a stale ABI; running plain torch ops")
        return None
    for fn, args in SIGNATURES.items():
        getattr(lib, fn).argtypes = args
        getattr(lib, fn).restype = None
    lib.kvf_has_bf16_gemm.restype = ctypes.c_int
    return lib
