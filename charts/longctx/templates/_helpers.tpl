{{/* Chart name. */}}
{{- define "longctx.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name when it already holds the chart name. */}}
{{- define "longctx.fullname" -}}
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

{{- define "longctx.selectorLabels" -}}
app.kubernetes.io/name: {{ include "longctx.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{/* Note: never app.kubernetes.io/managed-by=longctx-operator (that marks the operator's
own children); Helm's objects say Helm. */}}
{{- define "longctx.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "longctx.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/part-of: longctx
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "longctx.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "longctx.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "longctx.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Leader election (Kopf peering) is on with more than one replica. */}}
{{- define "longctx.peering" -}}
{{- if gt (int .Values.replicas) 1 -}}
{{- default (include "longctx.fullname" .) .Values.peering.name -}}
{{- end -}}
{{- end -}}

{{/*
Every namespaced permission the operator uses (operator/longctx_operator/kube.py,
reconcile.py, main.py and Kopf). Identical in both RBAC modes; only the binding differs.
*/}}
{{- define "longctx.namespacedRules" -}}
# The CR: Kopf lists and watches it, the reconcile reads it fresh.
- apiGroups: ["longctx.dev"]
  resources: ["longcontextdeployments"]
  verbs: ["get", "list", "watch"]
# The only write to the CR: its status (merge patch). The operator never writes spec.
- apiGroups: ["longctx.dev"]
  resources: ["longcontextdeployments/status"]
  verbs: ["patch"]
# Children: server-side apply (PATCH; the API server also checks create when the object
# does not exist yet), drift check (get), clean-up (list, delete), and Kopf's watches on
# the managed-by label.
- apiGroups: [""]
  resources: ["configmaps", "services", "serviceaccounts"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["statefulsets", "deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["policy"]
  resources: ["poddisruptionbudgets"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: ["inference.networking.k8s.io"]
  resources: ["inferencepools"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
# Optional children (not watched): HTTPRoute when a gateway is named, PodMonitor when
# its CRD exists.
- apiGroups: ["gateway.networking.k8s.io"]
  resources: ["httproutes"]
  verbs: ["get", "list", "create", "patch", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "list", "create", "patch", "delete"]
# Pods: status is computed from them (get, list) and Kopf watches them.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
# Events on the CR (Kopf posts them; it never updates one).
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# Held only so that the operator may grant them to the endpoint picker's Role (RBAC
# forbids granting what one does not hold; the chart grants no escalate/bind).
- apiGroups: ["llm-d.ai", "inference.networking.x-k8s.io"]
  resources: ["inferenceobjectives", "inferencemodelrewrites"]
  verbs: ["get", "list", "watch"]
{{- end -}}

{{/* Kopf peering (leader election): list/watch the peering object, patch our key into it. */}}
{{- define "longctx.peeringRule" -}}
- apiGroups: ["kopf.dev"]
  resources: [{{ . | quote }}]
  verbs: ["list", "watch", "patch"]
{{- end -}}
