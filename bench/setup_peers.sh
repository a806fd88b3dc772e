#!/usr/bin/env bash
# Creates bench/.venv-peers with the two Rust peer routers, apart from the project's venv.
# Both wheels are installed --no-deps (their declared deps pull whole engines); we add only
# what their entry points import. py-spy is here too, for profiling kvfleet's router.
# Idempotent: a venv that already answers the import check is left as it is.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${PEERS_VENV:-$here/.venv-peers}"
python="${PYTHON:-python3}"

check() {
    "$venv/bin/python" -c "import sglang_router, vllm_router, aiohttp, fastapi, uvicorn, orjson" \
        2>/dev/null && test -x "$venv/bin/vllm-router" && test -x "$venv/bin/py-spy"
}

if [ -x "$venv/bin/python" ] && check; then
    echo "peers venv ready: $venv"
    exit 0
fi

test -x "$venv/bin/python" || "$python" -m venv "$venv"
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q --no-deps "sglang-router==0.3.2" "vllm-router==0.1.17"
"$venv/bin/python" -m pip install -q aiohttp fastapi uvicorn orjson setproctitle requests \
    "py-spy==0.4.3"

if ! check; then
    echo "setup_peers: install finished but the import check failed in $venv" >&2
    exit 1
fi
echo "peers venv ready: $venv"
