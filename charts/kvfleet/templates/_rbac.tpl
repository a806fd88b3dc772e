{{/*
The operator's RBAC rules, split by where they are granted. Together they are exactly
operator/kvfleet_operator/runtimes/kubernetes/build/operator_manifests.py's RBAC_RULES (one
apiGroup and one resource per rule, the same verbs in the same order); tests/chart checks
it, so the two cannot drift. No `*` anywhere.
*/}}

{{/* Cluster-scoped objects: granted by the ClusterRole in every mode. */}}
{{- define "kvfleet.rules.cluster" -}}
# kopf notices the InferencePool CRD appear or change
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
# kopf, when watching several namespaces
- apiGroups: [""]
  resources: ["namespaces"]
  verbs: ["list", "watch"]
{{- end -}}

{{/* The pools and their children, except Secrets: the ClusterRole when every namespace is
watched, else a Role per watched namespace. */}}
{{- define "kvfleet.rules.namespaced" -}}
# watch pools; kopf's finalizer and progress annotations, the loop-state annotation
- apiGroups: ["kvfleet.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "patch"]
# conditions, replicas, decisions
- apiGroups: ["kvfleet.io"]
  resources: ["inferencepools/status"]
  verbs: ["patch"]
# apply the router's bootstrap config
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["create", "patch"]
# apply the engine and router Services
- apiGroups: [""]
  resources: ["services"]
  verbs: ["create", "patch"]
# apply engine and router Deployments; read and set engine replicas
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch"]
# apply the PDBs
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["create", "patch"]
# apply the engines' policy
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["create", "patch"]
# apply the GIE InferencePool of a pool with routing.gateway
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["create", "patch"]
# observe replicas; drain and deletion-cost annotations; remove a victim the ReplicaSet kept
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list", "watch", "patch", "delete"]
# open the kvfleet.io/routed readiness gate once a pod is routed
- apiGroups: [""]
  resources: ["pods/status"]
  verbs: ["patch"]
# Events on the pools (kvfleet's and kopf's)
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end -}}

{{/* The pools' two token Secrets: only ever in a namespaced Role, never cluster-wide. */}}
{{- define "kvfleet.rules.secrets" -}}
# read back and apply the two token Secrets
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["get", "create", "patch"]
{{- end -}}
