{{/*
The chart's name, also the pods' app.kubernetes.io/name: "capn" is capn's --self-labels
default, by which the tenants' NetworkPolicies admit capn's pods to etcd and the apiserver,
so it cannot be overridden (fullnameOverride renames the objects).
*/}}
{{- define "capn.name" -}}
{{- .Chart.Name }}
{{- end }}

{{/* The objects' name: the release name when it already holds the chart's name. */}}
{{- define "capn.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := .Chart.Name }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "capn.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The pods' selector. */}}
{{- define "capn.selectorLabels" -}}
app.kubernetes.io/name: {{ include "capn.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "capn.labels" -}}
helm.sh/chart: {{ include "capn.chart" . }}
{{ include "capn.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: controller
app.kubernetes.io/part-of: capn
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The image, its tag defaulting to "v" + appVersion (the release tag). */}}
{{- define "capn.image" -}}
{{- printf "%s:%s" .Values.image.repository (default (printf "v%s" .Chart.AppVersion) .Values.image.tag) }}
{{- end }}
