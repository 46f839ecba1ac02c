{{/* The labels every object of the chart carries: deploy/base's, plus Helm's. */}}
{{- define "gpushare-dra.labels" -}}
app.kubernetes.io/name: gpushare-dra
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The plugin pods' labels, which the DaemonSet, Service, ServiceMonitor and NetworkPolicy select. */}}
{{- define "gpushare-dra.selectorLabels" -}}
app.kubernetes.io/name: gpushare-dra
app.kubernetes.io/component: kubelet-plugin
{{- end -}}

{{- define "gpushare-dra.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* A file of deploy/ (linked in files/), as it is: its objects keep deploy/'s labels. */}}
{{- define "gpushare-dra.file" -}}
{{- $text := index . 1 }}
---
{{ $text }}
{{- end -}}
