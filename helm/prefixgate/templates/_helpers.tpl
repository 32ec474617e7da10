{{- define "prefixgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "prefixgate.fullname" -}}
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

{{- define "prefixgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "prefixgate.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "prefixgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "prefixgate.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: prefixgate
{{- end }}

{{- define "prefixgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "prefixgate.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "prefixgate.redisSecretName" -}}
{{- if .Values.redis.existingSecret }}{{ .Values.redis.existingSecret }}{{ else }}{{ include "prefixgate.fullname" . }}-redis{{ end }}
{{- end }}

{{/* The prefixgate container: the gateway Deployment and the sidecar snippet use the same spec. */}}
{{- define "prefixgate.container" -}}
name: prefixgate
image: "{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}"
imagePullPolicy: {{ .Values.image.pullPolicy }}
args: [{{ if eq .Values.mode "epp" }}"epp"{{ else }}"serve"{{ end }}, "--config", "/etc/prefixgate/config.yaml"]
ports:
  - name: http
    containerPort: {{ .Values.config.listen.port }}
    protocol: TCP
  {{- if eq .Values.mode "epp" }}
  - name: grpc
    containerPort: {{ .Values.epp.grpcPort }}
    protocol: TCP
  - name: grpc-health
    containerPort: {{ .Values.epp.healthPort }}
    protocol: TCP
  {{- end }}
  {{- with (.Values.config.admin | default dict).listen }}
  - name: admin
    containerPort: {{ .port }}
    protocol: TCP
  {{- end }}
env:
  - name: PYTHONUNBUFFERED
    value: "1"
  {{- if or .Values.redis.existingSecret .Values.redis.createSecret }}
  - name: PREFIXGATE_STATE
    valueFrom:
      secretKeyRef:
        name: {{ include "prefixgate.redisSecretName" . }}
        key: {{ .Values.redis.existingSecretKey }}
  {{- else if .Values.redis.url }}
  - name: PREFIXGATE_STATE
    value: {{ .Values.redis.url | quote }}
  {{- end }}
  {{- with .Values.env }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with .Values.envFrom }}
envFrom:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- if eq .Values.mode "epp" }}
livenessProbe:
  grpc:
    port: {{ .Values.epp.healthPort }}
    service: liveness
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  grpc:
    port: {{ .Values.epp.healthPort }}
    service: readiness
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- else }}
livenessProbe:
  httpGet:
    path: /healthz
    port: http
  {{- toYaml .Values.probes.liveness | nindent 2 }}
readinessProbe:
  httpGet:
    path: /readyz
    port: http
  {{- toYaml .Values.probes.readiness | nindent 2 }}
{{- end }}
{{- if .Values.shutdown.preStopSeconds }}
lifecycle:
  preStop:  # SIGTERM only once the endpoints have dropped the pod (python: always in the image)
    exec:
      command: ["python", "-c", "import time; time.sleep({{ .Values.shutdown.preStopSeconds }})"]
{{- end }}
resources:
  {{- toYaml .Values.resources | nindent 2 }}
securityContext:
  {{- toYaml .Values.securityContext | nindent 2 }}
volumeMounts:
  - name: config
    mountPath: /etc/prefixgate
    readOnly: true
  - name: tmp
    mountPath: /tmp
{{- end }}

{{- define "prefixgate.volumes" -}}
- name: config
  configMap:
    name: {{ include "prefixgate.fullname" . }}
- name: tmp
  emptyDir: {}
{{- end }}

{{/* Seconds from the pod's deletion to SIGKILL: the preStop wait, then the gateway's own drain
  (config.shutdown.grace_s, counted from SIGTERM), then a margin for the flush and the exit. */}}
{{- define "prefixgate.terminationGracePeriodSeconds" -}}
{{- $grace := (.Values.config.shutdown | default dict).grace_s | default 600 -}}
{{- add (int .Values.shutdown.preStopSeconds) (int (ceil $grace)) (int .Values.shutdown.marginSeconds) -}}
{{- end }}

{{/* The Service/ServiceMonitor port carrying /metrics: the admin port when config.admin.listen is set. */}}
{{- define "prefixgate.metricsPort" -}}
{{- if (.Values.config.admin | default dict).listen }}admin{{ else }}http{{ end -}}
{{- end }}
