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
Every namespaced permission the operator uses, generated from the operator's table of
kinds (`longctx rbac`, files/operator-rules.yaml). Identical in both RBAC modes; only the
binding differs.
*/}}
{{- define "longctx.namespacedRules" -}}
{{ .Files.Get "files/operator-rules.yaml" | trimSuffix "\n" }}
{{- end -}}

{{/* Kopf peering (leader election): list/watch the peering object, patch our key into it. */}}
{{- define "longctx.peeringRule" -}}
- apiGroups: ["kopf.dev"]
  resources: [{{ . | quote }}]
  verbs: ["list", "watch", "patch"]
{{- end -}}
