{{/*
Names, labels, the image, and the guards every template shares.
*/}}

{{- define "kvfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvfleet.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The operator's objects: `<fullname>-operator`. */}}
{{- define "kvfleet.operatorName" -}}
{{- printf "%s-operator" (include "kvfleet.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kvfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kvfleet.operatorName" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The operator pod's selector. The engines' NetworkPolicy admits the operator by exactly this
label (operator/kvfleet_operator/runtimes/kubernetes/build/options.py, OPERATOR_POD_LABELS), so it
is fixed, not derived from the release name.
*/}}
{{- define "kvfleet.selectorLabels" -}}
app.kubernetes.io/name: kvfleet-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "kvfleet.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "kvfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kvfleet
app.kubernetes.io/component: operator
{{- end -}}

{{/* kvfleet's image: repository@digest when a digest is set, else repository:tag. */}}
{{- define "kvfleet.image" -}}
{{- $repo := required "image.repository is required: kvfleet's image (operator, routers, builtin engines)" .Values.image.repository -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" $repo .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" $repo (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
{{- end -}}

{{/*
Values that cannot work together. (Any release namespace works: the operator is told
where it runs, `--operator-namespace`, and every pool's engine NetworkPolicy admits it
from there.)
*/}}
{{- define "kvfleet.checks" -}}
{{- if and .Values.operator.watchNamespaces .Values.rbac.secretNamespaces -}}
{{- fail "rbac.secretNamespaces is for operator.watchNamespaces: [] only; each watched namespace already gets a Role with the pools' Secrets" -}}
{{- end -}}
{{- if and .Values.metrics.serviceMonitor.enabled (not .Values.metrics.enabled) -}}
{{- fail "metrics.serviceMonitor.enabled needs metrics.enabled: the ServiceMonitor scrapes the operator's metrics Service" -}}
{{- end -}}
{{- end -}}

{{/*
The namespaces that get a Role with the Secrets rule: the watched ones, or (watching every
namespace) rbac.secretNamespaces, else the release namespace.
*/}}
{{- define "kvfleet.secretNamespaces" -}}
{{- if .Values.operator.watchNamespaces -}}
{{- toJson (uniq .Values.operator.watchNamespaces) -}}
{{- else if .Values.rbac.secretNamespaces -}}
{{- toJson (uniq .Values.rbac.secretNamespaces) -}}
{{- else -}}
{{- toJson (list .Release.Namespace) -}}
{{- end -}}
{{- end -}}
