#!/usr/bin/env bash
# e2e/images.sh: build kvfleet's image (images/Dockerfile) with buildah and run it under
# podman the way the operator's pods run it: uid 1000, read-only root filesystem, every
# capability dropped, no-new-privileges, only /tmp and /cache writable (the pods' emptyDirs),
# the builders' commands (`kvfleet engine`, `kvfleet router`, `kvfleet operator`).
#
# Checks: a tiny-random engine answers /health and a completion (its CPU kernels compiled in
# the read-only container); a SmolLM2 engine answers a chat completion; the router answers
# through to both, and its admin API reads the token file; SIGTERM drains both to exit 0;
# `kvfleet operator --help`, `operator run --help` and `operator render` run; the image has
# no shell and runs as 1000:1000. Prints the image's size.
#
# Needs root, podman, buildah, runc and (for the local base) debootstrap; without them it
# prints one `SKIP: ...` line and exits 77. Idempotent: the debootstrap base is cached
# (images/debootstrap-base.sh), buildah reuses its layers, and the containers it starts
# (named kvfleet-e2e-images-*) are removed on exit and before it starts.
#
# Env: KVFLEET_IMAGE (default ghcr.io/kvfleet/kvfleet:0.1.0, the operator's default image),
# KVFLEET_BASE_IMAGE (default localhost/kvfleet-base:bookworm, made by debootstrap; any other
# value is pulled, e.g. docker.io/library/debian:12.15-slim), KVFLEET_TORCH_WHEELS (a folder
# with a torch-*+cpu-cp311 wheel; default: the first such folder in pip's find-links, else the
# PyTorch CPU index), KVFLEET_BUILD_CA (a CA bundle pip trusts inside the build; default:
# pip's configured `cert`), KVFLEET_SKIP_BUILD=1 (test an image already built).
#
# Podman here: runc (crun fails on this cgroup setup), capped ulimits, and host networking for
# build and run (the default bridge network rewrites the host's iptables).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=e2e/lib.sh
. e2e/lib.sh

IMAGE=${KVFLEET_IMAGE:-ghcr.io/kvfleet/kvfleet:0.1.0}
BASE_IMAGE=${KVFLEET_BASE_IMAGE:-localhost/kvfleet-base:bookworm}
RUN_UID=1000  # operator/kvfleet_operator/runtimes/kubernetes/build/security.py RUN_AS_UID
NAME=kvfleet-e2e-images
ENGINE_TOKEN=e2e-engine-token
ADMIN_TOKEN=e2e-admin-token

log() { printf '[images %4ds] %s\n' "$SECONDS" "$*"; }

need="podman buildah runc"
case "$BASE_IMAGE" in localhost/kvfleet-base:*) need="$need debootstrap" ;; esac
for tool in $need python3; do
  command -v "$tool" >/dev/null 2>&1 \
    || skip "e2e/images.sh needs $tool (Debian: apt-get install podman buildah runc debootstrap)"
done
[ "$(id -u)" = 0 ] || skip "e2e/images.sh needs root (rootful podman, debootstrap)"

# The flags every podman/buildah call needs on these machines.
OCI=(--runtime runc)
LIMITS=(--network host --ulimit nofile=20000:20000 --ulimit nproc=32768:32768)
# As the pods run (security.py): non-root, read-only root, no capabilities, no escalation,
# and /tmp (+ /cache for engines and routers) as writable scratch, like their emptyDirs.
SECURE=(--read-only --read-only-tmpfs=false --user "$RUN_UID:$RUN_UID" --cap-drop ALL
        --security-opt no-new-privileges --tmpfs "/tmp:rw,exec,nosuid,nodev,mode=1777")
# security.cache_env(): HOME and every tool cache on the /cache emptyDir.
CACHE=(--tmpfs "/cache:rw,exec,nosuid,nodev,mode=1777"
       -e HOME=/cache -e XDG_CACHE_HOME=/cache -e XDG_CONFIG_HOME=/cache/config
       -e VLLM_CACHE_ROOT=/cache/vllm -e TRITON_CACHE_DIR=/cache/triton
       -e TORCHINDUCTOR_CACHE_DIR=/cache/inductor -e KVFLEET_KERNEL_DIR=/cache/kvfleet-kernels
       -e TMPDIR=/tmp)

# One run at a time per machine: the container names and the image tag are fixed.
LOCKS=${KVFLEET_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/kvfleet/images}
mkdir -p "$LOCKS"
exec 9> "$LOCKS/e2e-images.lock"
if command -v flock >/dev/null 2>&1 && ! flock -n 9; then
  log "another e2e/images.sh is running; waiting for it"
  flock -w 1800 9 || { echo "FAIL: e2e/images.sh lock not free after 30 minutes" >&2; exit 1; }
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvfleet-e2e-images.XXXXXX")
CONTAINERS=("$NAME-engine" "$NAME-smollm2" "$NAME-router" "$NAME-operator")
remove_containers() {
  local c
  for c in "${CONTAINERS[@]}"; do
    podman "${OCI[@]}" rm -f -t 5 "$c" >/dev/null 2>&1 || true
  done
}
ok=0
cleanup() {
  remove_containers
  if [ "$ok" = 1 ]; then rm -rf "$WORK"; else echo "images: logs kept in $WORK" >&2; fi
}
trap cleanup EXIT
remove_containers  # leftovers of an interrupted run

fail() {
  echo "FAIL: $*" >&2
  local c
  for c in "${CONTAINERS[@]}"; do
    if podman container exists "$c" 2>/dev/null; then
      echo "--- last lines of $c" >&2
      podman logs --tail 25 "$c" >&2 2>&1 || true
    fi
  done
  exit 1
}

running() { [ "$(podman inspect -f '{{.State.Running}}' "$1" 2>/dev/null)" = true ]; }

wait_health() {  # NAME URL SECONDS
  local deadline=$((SECONDS + $3))
  until http GET "$2" >/dev/null 2>&1; do
    running "$1" || fail "$1 exited before answering $2"
    [ "$SECONDS" -lt "$deadline" ] || fail "$1 did not answer $2 within $3 s"
    sleep 1
  done
}

# ---------------------------------------------------------------- build
if [ "${KVFLEET_SKIP_BUILD:-0}" != 1 ]; then
  case "$BASE_IMAGE" in
    localhost/kvfleet-base:*) images/debootstrap-base.sh "$BASE_IMAGE" ;;
  esac

  pip_config() {  # KEY: pip's configured value (env first), empty when unset
    local pip
    for pip in .venv/bin/pip pip3; do
      if command -v "$pip" >/dev/null 2>&1; then
        "$pip" config list 2>/dev/null | sed -n "s/^[^=]*\.$1='\(.*\)'$/\1/p" | head -1
        return
      fi
    done
  }
  build=(--layers "${OCI[@]}" "${LIMITS[@]}" -f images/Dockerfile -t "$IMAGE"
         --build-arg "BASE=$BASE_IMAGE")
  wheels=${KVFLEET_TORCH_WHEELS:-}
  if [ -z "$wheels" ]; then
    for dir in ${PIP_FIND_LINKS:-} $(pip_config find-links); do
      if compgen -G "$dir/torch-*+cpu-cp311-*.whl" >/dev/null; then wheels=$dir; break; fi
    done
  fi
  if [ -n "$wheels" ]; then
    wheel=$(compgen -G "$wheels/torch-*+cpu-cp311-*.whl" | sort -V | tail -1) \
      || fail "no torch-*+cpu-cp311 wheel in $wheels"
    version=$(basename "$wheel" | cut -d- -f2)
    log "torch: $version from the local wheel folder $wheels (bind-mounted into the build)"
    build+=(--volume "$wheels:/wheels:ro" --build-arg TORCH_INDEX_URL=
            --build-arg TORCH_FIND_LINKS=/wheels --build-arg "TORCH_SPEC=torch==$version")
  else
    log "torch: from the PyTorch CPU index (the Dockerfile's default)"
  fi
  ca=${KVFLEET_BUILD_CA:-${PIP_CERT:-$(pip_config cert)}}
  if [ -n "$ca" ] && [ -f "$ca" ]; then
    build+=(--volume "$ca:/run/kvfleet-build-ca.crt:ro"
            --build-arg PIP_CERT=/run/kvfleet-build-ca.crt)
  fi
  log "building $IMAGE from $BASE_IMAGE (log: $WORK/build.log)"
  if ! buildah build "${build[@]}" . > "$WORK/build.log" 2>&1; then
    tail -40 "$WORK/build.log" >&2
    fail "buildah build failed"
  fi
  grep -E '^\[[0-9]+/[0-9]+\] STEP [0-9]+/[0-9]+: (RUN|COPY|FROM)' "$WORK/build.log" \
    | cut -c1-110 | sed 's/^/  /' || true
  log "built $IMAGE"
fi
podman image exists "$IMAGE" || fail "$IMAGE is not in podman's storage"

# ---------------------------------------------------------------- image metadata
user=$(podman image inspect -f '{{.Config.User}}' "$IMAGE")
[ "$user" = "$RUN_UID:$RUN_UID" ] || fail "image user is '$user', not $RUN_UID:$RUN_UID"
log "image user: $user"
if podman "${OCI[@]}" run --rm --name "$NAME-operator" "${LIMITS[@]}" "${SECURE[@]}" \
    --entrypoint /bin/sh "$IMAGE" -c true >/dev/null 2>&1; then
  fail "the image has a /bin/sh"
fi
log "no shell: running /bin/sh fails, as it should"

# ---------------------------------------------------------------- operator
for args in "operator --help" "operator run --help"; do
  # shellcheck disable=SC2086  # word splitting is the point
  podman "${OCI[@]}" run --rm --name "$NAME-operator" "${LIMITS[@]}" "${SECURE[@]}" \
    --entrypoint '["kvfleet"]' "$IMAGE" $args > "$WORK/operator.txt" 2>&1 \
    || { cat "$WORK/operator.txt" >&2; fail "kvfleet $args failed"; }
  grep -q '^usage: kvfleet operator' "$WORK/operator.txt" || fail "kvfleet $args: no usage line"
  log "operator: kvfleet $args ok"
done
podman "${OCI[@]}" run --rm --name "$NAME-operator" "${LIMITS[@]}" "${SECURE[@]}" \
  -v "$PWD/examples/local-cpu.yaml:/pool.yaml:ro" --entrypoint '["kvfleet"]' "$IMAGE" \
  operator render /pool.yaml > "$WORK/render.yaml" 2>&1 \
  || { cat "$WORK/render.yaml" >&2; fail "kvfleet operator render failed"; }
grep -q "image: $IMAGE" "$WORK/render.yaml" || fail "render: no pod runs $IMAGE"
log "operator: render examples/local-cpu.yaml ok ($(grep -c '^kind:' "$WORK/render.yaml") objects)"
podman "${OCI[@]}" run --rm --name "$NAME-operator" "${LIMITS[@]}" "${SECURE[@]}" \
  --entrypoint '["python", "-c"]' "$IMAGE" \
  "import zmq, msgpack, grpc, kvfleet_router.vllm_kv_events, kvfleet_router.epp.server" \
  > "$WORK/extras.txt" 2>&1 || { cat "$WORK/extras.txt" >&2; fail "the router's extras do not import"; }
log "router extras: vLLM KV events (pyzmq, msgpack) and the endpoint picker (grpcio) import"

# ---------------------------------------------------------------- engines
start_engine() {  # CONTAINER PORT MODEL SERVED_NAME
  podman "${OCI[@]}" run -d --name "$1" "${LIMITS[@]}" "${SECURE[@]}" "${CACHE[@]}" \
    -e "KVFLEET_ENGINE_TOKEN=$ENGINE_TOKEN" --entrypoint '["kvfleet", "engine"]' "$IMAGE" \
    --model "$3" --served-model-name "$4" --runner torch --role unified \
    --host 127.0.0.1 --port "$2" --max-num-seqs 4 --max-num-batched-tokens 256 \
    --num-blocks 128 --max-model-len 512 --drain-timeout 20 --log-level info >/dev/null \
    || fail "podman run $1 failed"
}
TINY_PORT=$(free_port)
SMOL_PORT=$(free_port)
ROUTER_PORT=$(free_port)
EPP_PORT=$(free_port)
log "engine: tiny-random on 127.0.0.1:$TINY_PORT, smollm2-135m on 127.0.0.1:$SMOL_PORT"
start_engine "$NAME-engine" "$TINY_PORT" tiny-random tiny-random
start_engine "$NAME-smollm2" "$SMOL_PORT" smollm2-135m smollm2
wait_health "$NAME-engine" "http://127.0.0.1:$TINY_PORT/health" 300
log "engine: tiny-random /health ok"
out=$(http POST "http://127.0.0.1:$TINY_PORT/v1/completions" \
  '{"model": "tiny-random", "prompt": "Hello", "max_tokens": 8, "temperature": 0}') \
  || fail "engine completion: $out"
echo "$out" | json_check 'd["choices"][0]["finish_reason"] and d["usage"]["completion_tokens"] > 0' \
  || fail "engine completion: unexpected answer $out"
log "engine: completion ok ($(echo "$out" | json_get 'd["usage"]'))"
podman logs "$NAME-engine" > "$WORK/engine.log" 2>&1
if grep "plain torch ops" "$WORK/engine.log" >&2 \
    || ! grep -q "compiling kvfleet CPU kernels into /cache/kvfleet-kernels" "$WORK/engine.log"; then
  fail "engine: the CPU kernels did not build in the read-only container"
fi
log "engine: CPU kernels built and loaded in /cache/kvfleet-kernels"
wait_health "$NAME-smollm2" "http://127.0.0.1:$SMOL_PORT/health" 300
log "engine: smollm2-135m /health ok"

# ---------------------------------------------------------------- router
mkdir -p "$WORK/router" "$WORK/admin"
cat > "$WORK/router/router.yaml" <<EOF
schema: kvfleet.io/router/v1
version: 1
endpoints:
  - {name: tiny, url: "http://127.0.0.1:$TINY_PORT", role: unified, models: [tiny-random]}
  - {name: smollm2, url: "http://127.0.0.1:$SMOL_PORT", role: unified, models: [smollm2]}
policy:
  name: cache-aware
EOF
printf '%s\n' "$ADMIN_TOKEN" > "$WORK/admin/token"
# As the pod's Secret volume: mode 0440, readable through the pod's group (fsGroup 1000).
chown -R "0:$RUN_UID" "$WORK/router" "$WORK/admin"
chmod 0750 "$WORK/router" "$WORK/admin"
chmod 0440 "$WORK/admin/token" "$WORK/router/router.yaml"
podman "${OCI[@]}" run -d --name "$NAME-router" "${LIMITS[@]}" "${SECURE[@]}" "${CACHE[@]}" \
  -e "KVFLEET_ENGINE_TOKEN=$ENGINE_TOKEN" \
  -v "$WORK/router:/etc/kvfleet/router:ro" -v "$WORK/admin:/var/run/secrets/kvfleet/admin:ro" \
  --entrypoint '["kvfleet", "router"]' "$IMAGE" \
  --host 127.0.0.1 --port "$ROUTER_PORT" --config /etc/kvfleet/router/router.yaml \
  --admin-token-file /var/run/secrets/kvfleet/admin/token --log-level info \
  --epp-port "$EPP_PORT" >/dev/null \
  || fail "podman run router failed"
wait_health "$NAME-router" "http://127.0.0.1:$ROUTER_PORT/health" 120
log "router: /health ok on 127.0.0.1:$ROUTER_PORT"
for i in 1 2 3; do
  out=$(http POST "http://127.0.0.1:$ROUTER_PORT/v1/completions" \
    "{\"model\": \"tiny-random\", \"prompt\": \"Request $i through the router\", \"max_tokens\": 6}") \
    || fail "router completion $i: $out"
  echo "$out" | json_check 'd["choices"][0]["finish_reason"]' || fail "router completion: $out"
done
log "router: 3 completions through to the tiny-random engine ok"
out=$(http POST "http://127.0.0.1:$ROUTER_PORT/v1/chat/completions" \
  '{"model": "smollm2", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8, "temperature": 0}') \
  || fail "router chat completion: $out"
echo "$out" | json_check 'd["choices"][0]["message"]["content"]' || fail "router chat: $out"
log "router: chat completion through to smollm2 ok: $(echo "$out" | json_get 'repr(d["choices"][0]["message"]["content"])')"
status=$(HTTP_STATUS=1 http GET "http://127.0.0.1:$ROUTER_PORT/admin/config")
[ "$status" = 401 ] || fail "router admin without a token answered $status, not 401"
out=$(http GET "http://127.0.0.1:$ROUTER_PORT/admin/config" "" "$ADMIN_TOKEN") \
  || fail "router admin with the token file's token: $out"
log "router: admin API reads the mounted token file (401 without it, 200 with it)"
alpn=$(python3 - "$EPP_PORT" <<'PY'
import socket, ssl, sys
ctx = ssl.create_default_context()
ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # self-signed, as GIE's picker
ctx.set_alpn_protocols(["h2"])
with ctx.wrap_socket(socket.create_connection(("127.0.0.1", int(sys.argv[1])), 10)) as tls:
    print(tls.selected_alpn_protocol())
PY
) || fail "router: no TLS on the endpoint-picker port $EPP_PORT"
[ "$alpn" = h2 ] || fail "router: the endpoint-picker port speaks '$alpn', not h2 (gRPC)"
log "router: the Gateway API endpoint picker (--epp-port) answers TLS with h2 (gRPC)"

# ---------------------------------------------------------------- drain on SIGTERM
for c in "$NAME-router" "$NAME-engine" "$NAME-smollm2"; do
  podman "${OCI[@]}" stop -t 40 "$c" >/dev/null
  code=$(podman inspect -f '{{.State.ExitCode}}' "$c")
  [ "$code" = 0 ] || fail "$c exited $code after SIGTERM, not 0"
done
log "SIGTERM: router and engines drained and exited 0 (PID 1, no init, no shell)"

size=$(podman image inspect -f '{{.Size}}' "$IMAGE")
log "image $IMAGE: $((size / 1000000)) MB ($(podman image inspect -f '{{len .RootFS.Layers}}' "$IMAGE") layers)"
ok=1
log "all image checks passed"
