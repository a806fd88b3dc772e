#!/usr/bin/env bash
# e2e/kind.sh: kvfleet on a real Kubernetes cluster (kind), end to end.
#
#  1. build kvfleet's image with docker (images/Dockerfile: Debian slim, PyTorch CPU index);
#  2. create a kind cluster (or reuse one of that name) and load the image into it;
#  3. `helm install` charts/kvfleet into kvfleet-system (the operator, its RBAC, the CRD);
#  4. apply e2e/pools/kind-cpu.yaml (builtin engine, tiny-random on CPU, 1-2 replicas) and
#     `kubectl wait --for=condition=Ready inferencepool/e2e-cpu`;
#  5. send completions through the router (kubectl port-forward to its Service);
#  6. drive load from a pod in the cluster until the pool scales to 2 ready replicas;
#  7. drop to a trickle and wait until it is back at 1 replica (drained, pod gone), with zero
#     failed requests in either phase;
#  8. delete the pool and check that garbage collection removed every child (Deployments,
#     ReplicaSets, Pods, Services, EndpointSlices, ConfigMap, Secrets, PDBs, NetworkPolicy).
#
# Needs docker (with a daemon), kind, kubectl, helm and python3; where one is missing it prints
# one `SKIP: ...` line and exits 77. Idempotent: it reuses a cluster of the same name, upgrades
# the release, and replaces the pool and its load pods; a cluster it created is deleted on
# exit unless KVFLEET_KEEP_CLUSTER=1.
#
# Env: KVFLEET_KIND_CLUSTER (default kvfleet-e2e), KVFLEET_IMAGE (default
# ghcr.io/kvfleet/kvfleet:0.1.0, the chart's and the operator's default), KVFLEET_SKIP_BUILD=1
# (the image is already in docker), KVFLEET_KIND_NODE_IMAGE (kind's --image),
# KVFLEET_E2E_ARTIFACTS (a folder for diagnostics on failure), KVFLEET_KEEP_CLUSTER=1.
#
# Helm values it sets (everything else is the chart's default): image.repository/tag (split
# from KVFLEET_IMAGE), image.pullPolicy=IfNotPresent (the image was loaded, not pushed),
# rbac.secretNamespaces={kvfleet-e2e} (the pool's namespace, for its token Secrets) and
# operator.maxTickSeconds=2 (short loops for a test).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=e2e/lib.sh
. e2e/lib.sh

CLUSTER=${KVFLEET_KIND_CLUSTER:-kvfleet-e2e}
IMAGE=${KVFLEET_IMAGE:-ghcr.io/kvfleet/kvfleet:0.1.0}
OPERATOR_NS=kvfleet-system  # the engines' NetworkPolicy admits the operator from here
NS=kvfleet-e2e
POOL=e2e-cpu
MODEL=tiny  # the pool's servedModelName
POOL_FILE=e2e/pools/kind-cpu.yaml
RELEASE=kvfleet

log() { printf '[kind %4ds] %s\n' "$SECONDS" "$*"; }

missing=()
if ! command -v docker >/dev/null 2>&1; then
  missing+=("docker")
elif ! docker info >/dev/null 2>&1; then
  missing+=("a Docker daemon (docker info failed)")
fi
for tool in kind kubectl helm python3; do
  command -v "$tool" >/dev/null 2>&1 || missing+=("$tool")
done
if [ "${#missing[@]}" -gt 0 ]; then
  what=$(printf '%s, ' "${missing[@]}")
  skip "e2e/kind.sh needs ${what%, } (kind runs Kubernetes in Docker)"
fi

k() { kubectl --context "kind-$CLUSTER" "$@"; }
kn() { k -n "$NS" "$@"; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/kvfleet-e2e-kind.XXXXXX")
created=0
pf_pid=
ok=0

diagnose() {
  echo "--- diagnostics" >&2
  {
    echo "## pool"; kn get inferencepool "$POOL" -o yaml
    echo "## objects"; kn get all,cm,secret,pdb,networkpolicy,endpointslices -o wide
    echo "## events"; kn get events --sort-by=.lastTimestamp
    echo "## operator"; k -n "$OPERATOR_NS" logs -l app.kubernetes.io/name=kvfleet-operator --tail 300
    echo "## router"; kn logs -l "kvfleet.io/pool=$POOL,kvfleet.io/role=router" --tail 100
    echo "## engines"; kn logs -l "kvfleet.io/pool=$POOL,app.kubernetes.io/component=engine" --tail 100
  } > "$WORK/diagnostics.txt" 2>&1 || true
  tail -150 "$WORK/diagnostics.txt" >&2
  if [ -n "${KVFLEET_E2E_ARTIFACTS:-}" ]; then
    mkdir -p "$KVFLEET_E2E_ARTIFACTS"
    cp "$WORK"/*.txt "$WORK"/*.log "$KVFLEET_E2E_ARTIFACTS"/ 2>/dev/null || true
  fi
}

cleanup() {
  [ -z "$pf_pid" ] || kill "$pf_pid" 2>/dev/null || true
  [ "$ok" = 1 ] || diagnose
  if [ "$created" = 1 ] && [ "${KVFLEET_KEEP_CLUSTER:-0}" != 1 ]; then
    log "deleting kind cluster $CLUSTER"
    kind delete cluster --name "$CLUSTER" >/dev/null 2>&1 || true
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() { echo "FAIL: $*" >&2; exit 1; }

# wait_for DESCRIPTION SECONDS COMMAND...: until COMMAND succeeds, with progress lines.
wait_for() {
  local what=$1 limit=$2 deadline=$((SECONDS + $2)) next=$((SECONDS + 15))
  shift 2
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || fail "$what: not within $limit s"
    if [ "$SECONDS" -ge "$next" ]; then
      log "  waiting for $what: unified $(pool_field readyOfDesired) ready/desired"
      next=$((SECONDS + 15))
    fi
    sleep 2
  done
}

pool_field() { kn get inferencepool "$POOL" -o "jsonpath={.status.roles.unified.$1}" 2>/dev/null; }
engine_pods() {
  kn get pods -l "kvfleet.io/pool=$POOL,kvfleet.io/role=unified" -o name 2>/dev/null | wc -l
}

# ---------------------------------------------------------------- image and cluster
if [ "${KVFLEET_SKIP_BUILD:-0}" != 1 ]; then
  log "building $IMAGE (docker build -f images/Dockerfile .)"
  docker build -q -f images/Dockerfile -t "$IMAGE" . > "$WORK/build.log" 2>&1 \
    || { tail -40 "$WORK/build.log" >&2; fail "docker build failed"; }
fi
docker image inspect "$IMAGE" >/dev/null 2>&1 || fail "$IMAGE is not in docker"

if kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
  log "reusing kind cluster $CLUSTER"
else
  log "creating kind cluster $CLUSTER"
  node=()
  [ -z "${KVFLEET_KIND_NODE_IMAGE:-}" ] || node=(--image "$KVFLEET_KIND_NODE_IMAGE")
  created=1
  kind create cluster --name "$CLUSTER" "${node[@]}" --wait 180s > "$WORK/kind.log" 2>&1 \
    || { cat "$WORK/kind.log" >&2; fail "kind create cluster failed"; }
fi
log "loading $IMAGE into the cluster's nodes"
kind load docker-image "$IMAGE" --name "$CLUSTER" > "$WORK/kind-load.log" 2>&1 \
  || { cat "$WORK/kind-load.log" >&2; fail "kind load docker-image failed"; }

# ---------------------------------------------------------------- helm install
k create namespace "$NS" --dry-run=client -o yaml | k apply -f - >/dev/null
log "helm upgrade --install $RELEASE charts/kvfleet -n $OPERATOR_NS"
helm upgrade --install "$RELEASE" charts/kvfleet --kube-context "kind-$CLUSTER" \
  --namespace "$OPERATOR_NS" --create-namespace \
  --set "image.repository=${IMAGE%:*}" --set "image.tag=${IMAGE##*:}" \
  --set image.pullPolicy=IfNotPresent --set "rbac.secretNamespaces={$NS}" \
  --set operator.maxTickSeconds=2 --wait --timeout 5m > "$WORK/helm.log" 2>&1 \
  || { cat "$WORK/helm.log" >&2; fail "helm install failed"; }
k get crd inferencepools.kvfleet.io >/dev/null || fail "helm did not install the CRD"
log "operator ready: $(k -n "$OPERATOR_NS" get pods -l app.kubernetes.io/name=kvfleet-operator -o name)"

# ---------------------------------------------------------------- the pool
if kn get inferencepool "$POOL" >/dev/null 2>&1; then  # left by an interrupted run
  kn delete inferencepool "$POOL" --wait --timeout=180s >/dev/null
fi
kn delete pod -l app.kubernetes.io/name=kvfleet-e2e-loadgen --ignore-not-found --wait >/dev/null
log "applying $POOL_FILE"
kn apply -f "$POOL_FILE" >/dev/null
kn wait --for=condition=Ready "inferencepool/$POOL" --timeout=600s >/dev/null \
  || fail "inferencepool/$POOL did not become Ready"
log "inferencepool/$POOL Ready: unified $(pool_field readyOfDesired)"

# Every child carries an ownerReference to the pool (what garbage collection follows).
uid=$(kn get inferencepool "$POOL" -o jsonpath='{.metadata.uid}')
CHILD_KINDS=deployments,services,configmaps,secrets,poddisruptionbudgets,networkpolicies
kn get "$CHILD_KINDS" -l "kvfleet.io/pool=$POOL" -o json > "$WORK/children.json"
python3 - "$WORK/children.json" "$uid" <<'PY' || fail "a child of the pool has no ownerReference to it"
import json, sys
items = json.load(open(sys.argv[1]))["items"]
bad = [f"{o['kind']}/{o['metadata']['name']}" for o in items
       if not any(r.get("uid") == sys.argv[2] and r.get("controller")
                  for r in o["metadata"].get("ownerReferences", []))]
print(f"[kind] {len(items)} children, each owned by the pool" if not bad else f"not owned: {bad}")
sys.exit(1 if bad or not items else 0)
PY

# ---------------------------------------------------------------- requests through the router
PORT=$(free_port)
# kubectl itself in the background (not the k/kn wrappers), so that $pf_pid is kubectl's.
kubectl --context "kind-$CLUSTER" -n "$NS" port-forward "svc/$POOL-router" "$PORT:8000" \
  > "$WORK/port-forward.log" 2>&1 &
pf_pid=$!
router_up() { http GET "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; }
wait_for "the router through port-forward" 60 router_up
for i in 1 2 3 4 5; do
  out=$(http POST "http://127.0.0.1:$PORT/v1/completions" \
    "{\"model\": \"$MODEL\", \"prompt\": \"Hello $i\", \"max_tokens\": 8}") \
    || fail "completion $i through the router: $out"
  echo "$out" | json_check 'd["choices"][0]["finish_reason"]' || fail "completion $i: $out"
done
log "router: 5 completions through kubectl port-forward ok"
out=$(http GET "http://127.0.0.1:$PORT/v1/models") || fail "/v1/models: $out"
echo "$out" | json_check "any(m['id'] == '$MODEL' for m in d['data'])" || fail "/v1/models: $out"

# ---------------------------------------------------------------- load: scale up, then down
kn create configmap e2e-loadgen --from-file=loadgen.py=e2e/loadgen.py --dry-run=client -o yaml \
  | kn apply -f - >/dev/null

start_load() {  # POD CONCURRENCY
  kn apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
  labels: {app.kubernetes.io/name: kvfleet-e2e-loadgen}
spec:
  restartPolicy: Never
  automountServiceAccountToken: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    runAsGroup: 1000
    seccompProfile: {type: RuntimeDefault}
  containers:
    - name: loadgen
      image: $IMAGE
      imagePullPolicy: IfNotPresent
      command: [python, /e2e/loadgen.py]
      args: ["--url", "http://$POOL-router:8000", "--model", "$MODEL", "--concurrency", "$2",
             "--max-tokens", "32", "--stop-file", "/tmp/stop"]
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities: {drop: [ALL]}
      resources: {requests: {cpu: 100m, memory: 64Mi}}
      volumeMounts:
        - {name: loadgen, mountPath: /e2e, readOnly: true}
        - {name: tmp, mountPath: /tmp}
  volumes:
    - {name: loadgen, configMap: {name: e2e-loadgen}}
    - {name: tmp, emptyDir: {}}
EOF
  kn wait --for=condition=Ready "pod/$1" --timeout=120s >/dev/null || fail "load pod $1 not running"
}

stop_load() {  # POD: stop it, print its summary, fail unless every request was served
  kn exec "$1" -- python -c "open('/tmp/stop', 'w').close()"
  kn wait --for=jsonpath='{.status.phase}'=Succeeded "pod/$1" --timeout=300s >/dev/null \
    || fail "load pod $1 did not finish"
  kn logs "$1" > "$WORK/$1.log"
  summary=$(sed -n 's/^SUMMARY //p' "$WORK/$1.log")
  [ -n "$summary" ] || fail "$1 printed no summary"
  log "$1: $summary"
  echo "$summary" | json_check 'd["failed"] == 0 and d["ok"] > 0' \
    || fail "$1: failed requests (or none served): $summary"
  kn delete pod "$1" --wait >/dev/null
}

scaled_up() { [ "$(pool_field readyReplicas)" -ge 2 ] 2>/dev/null; }
scaled_down() {
  [ "$(pool_field desiredReplicas)" = 1 ] && [ "$(pool_field replicas)" = 1 ] \
    && [ "$(engine_pods)" -eq 1 ]
}

log "load: 8 clients in a closed loop (4 sequences per replica, target 1 waiting per replica)"
start_load e2e-load-high 8
wait_for "scale-up to 2 ready replicas" 600 scaled_up
log "scaled up: unified $(pool_field readyOfDesired) ($(pool_field lastScaleDecision.reason))"
stop_load e2e-load-high

log "load: 1 client while the pool scales down (drain first, then remove)"
start_load e2e-load-low 1
wait_for "scale-down to 1 replica" 600 scaled_down
log "scaled down: unified $(pool_field readyOfDesired) ($(pool_field lastScaleDecision.reason))"
sleep 5
stop_load e2e-load-low
kn get events --field-selector "involvedObject.name=$POOL" \
  -o custom-columns=REASON:.reason,MESSAGE:.message --no-headers | tail -8 | sed 's/^/  /'

# ---------------------------------------------------------------- garbage collection
kill "$pf_pid" 2>/dev/null || true
pf_pid=
log "deleting inferencepool/$POOL"
kn delete inferencepool "$POOL" --wait --timeout=180s >/dev/null
leftovers() {
  {
    kn get "$CHILD_KINDS,replicasets,pods" -l "kvfleet.io/pool=$POOL" -o name
    kn get endpointslices -o name \
      -l "kubernetes.io/service-name in ($POOL-router,$POOL-unified)"
  } 2>/dev/null
}
gone() { [ -z "$(leftovers)" ]; }
wait_for "garbage collection of every child" 180 gone  # on failure: diagnostics list them
log "garbage collection removed every child of the pool"
kn delete configmap e2e-loadgen --ignore-not-found >/dev/null

ok=1
log "all kind checks passed"
