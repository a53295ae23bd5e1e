{{/* The installer image: image.repository:image.tag, the tag defaulting to the chart's appVersion. */}}
{{- define "grouped-snapshotter.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The install mode, checked: cri or runtime-handler. */}}
{{- define "grouped-snapshotter.mode" -}}
{{- if not (has .Values.mode (list "cri" "runtime-handler")) -}}
{{- fail (printf "mode %q: want cri or runtime-handler" .Values.mode) -}}
{{- end -}}
{{- if and (eq .Values.mode "runtime-handler") (not .Values.runtimeHandler) -}}
{{- fail "mode runtime-handler needs runtimeHandler" -}}
{{- end -}}
{{ .Values.mode }}
{{- end }}

{{/* GS_DAEMON_FLAGS: --metrics-address, then daemonFlags. */}}
{{- define "grouped-snapshotter.daemonFlags" -}}
{{- $flags := list -}}
{{- with .Values.metrics.address -}}
{{- $flags = append $flags (printf "--metrics-address %s" .) -}}
{{- end -}}
{{- with .Values.daemonFlags -}}
{{- $flags = append $flags . -}}
{{- end -}}
{{ join " " $flags }}
{{- end }}

{{/* The labels of every object, and the DaemonSet's selector: stable across releases. */}}
{{- define "grouped-snapshotter.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
{{- end }}
