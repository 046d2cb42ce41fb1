{{/* Chart name, truncated to the 63 characters a label value allows. */}}
{{- define "toolrl-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified name of the release's objects. */}}
{{- define "toolrl-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "toolrl-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels that select the operator's pods; never change them after a release. */}}
{{- define "toolrl-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "toolrl-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The standard labels of every object of the chart. */}}
{{- define "toolrl-operator.labels" -}}
helm.sh/chart: {{ include "toolrl-operator.chart" . }}
{{ include "toolrl-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: toolrl-operator
{{- end }}

{{- define "toolrl-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "toolrl-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "toolrl-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* Namespaces the PodMonitors look in: the watched ones, or all. */}}
{{- define "toolrl-operator.monitorNamespaces" -}}
{{- if .Values.watchNamespaces -}}
matchNames:
{{ toYaml .Values.watchNamespaces | indent 2 }}
{{- else -}}
any: true
{{- end -}}
{{- end }}
