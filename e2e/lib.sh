# shellcheck shell=bash
# e2e/lib.sh: helpers shared by e2e/images.sh and e2e/kind.sh (sourced, never run).
# HTTP and JSON go through the host's python3 (standard library only), so the scripts need
# neither curl nor jq.

SKIP_RC=77  # "skipped" (automake's convention); the tests read it

skip() { echo "SKIP: $*"; exit "$SKIP_RC"; }

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# http METHOD URL [JSON_BODY [TOKEN]]: prints the body; exits 1 on a non-2xx status.
# With HTTP_STATUS=1 it prints only the status code (0: no connection) and never fails.
http() {
  python3 - "$@" <<'PY'
import os, sys, urllib.error, urllib.request
method, url = sys.argv[1], sys.argv[2]
body = sys.argv[3].encode() if len(sys.argv) > 3 and sys.argv[3] else None
req = urllib.request.Request(url, data=body, method=method)
if body:
    req.add_header("content-type", "application/json")
if len(sys.argv) > 4:
    req.add_header("authorization", f"Bearer {sys.argv[4]}")
try:
    with urllib.request.urlopen(req, timeout=120) as resp:
        status, text = resp.status, resp.read().decode()
except urllib.error.HTTPError as e:
    status, text = e.code, e.read().decode()
except OSError as e:
    status, text = 0, str(e)
if os.environ.get("HTTP_STATUS") == "1":
    print(status)
    sys.exit(0)
print(text)
sys.exit(0 if 200 <= status < 300 else 1)
PY
}

# json_check EXPR: reads JSON on stdin; exits 1 unless the Python expression on `d` holds.
json_check() {
  python3 -c 'import json, sys; d = json.load(sys.stdin); sys.exit(0 if eval(sys.argv[1]) else 1)' "$1"
}

# json_get EXPR: reads JSON on stdin; prints the Python expression on `d`.
json_get() {
  python3 -c 'import json, sys; d = json.load(sys.stdin); print(eval(sys.argv[1]))' "$1"
}
