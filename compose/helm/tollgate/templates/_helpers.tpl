{{/* Names, labels and the shared pieces of the pod templates. */}}

{{- define "tollgate.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tollgate.fullname" -}}
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

{{/* tollgate.component: the name of a component's objects ("gateway", "aggregator"). */}}
{{- define "tollgate.component" -}}
{{- printf "%s-%s" (include "tollgate.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "tollgate.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "tollgate.selectorLabels" . }}
{{- end -}}

{{- define "tollgate.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tollgate.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "tollgate.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "tollgate.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "tollgate.secretName" -}}
{{- default (printf "%s-secrets" (include "tollgate.fullname" .)) .Values.secrets.existingSecret -}}
{{- end -}}

{{- define "tollgate.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Checks of values the schema cannot express; each stops the render with what to set. */}}
{{- define "tollgate.validate" -}}
{{- if not .Values.redis.addrs -}}
{{- fail "redis.addrs: set the address of your Redis (host:port; Sentinel or Cluster: every sentinel or seed node)" -}}
{{- end -}}
{{- if and .Values.aggregator.enabled (not .Values.kafka.brokers) -}}
{{- fail "kafka.brokers: the aggregators need Kafka; set your brokers (host:port), or aggregator.enabled=false" -}}
{{- end -}}
{{- if not .Values.secrets.existingSecret -}}
{{- if lt (len .Values.secrets.keySecret) 16 -}}
{{- fail "secrets.keySecret: set it (at least 16 bytes: openssl rand -base64 32), or secrets.existingSecret" -}}
{{- end -}}
{{- if and .Values.gateway.checkAPI.enabled (not .Values.secrets.apiToken) -}}
{{- fail "secrets.apiToken: the check API listens beyond loopback and needs a token: set it, or secrets.existingSecret" -}}
{{- end -}}
{{- if and .Values.aggregator.enabled (not .Values.secrets.adminToken) -}}
{{- fail "secrets.adminToken: the operator API needs a token: set it, or secrets.existingSecret" -}}
{{- end -}}
{{- with .Values.secrets.viewerToken -}}
{{- if lt (len .) 16 -}}
{{- fail "secrets.viewerToken: at least 16 characters (openssl rand -base64 32), or leave it empty for no viewer token" -}}
{{- end -}}
{{- if eq . $.Values.secrets.adminToken -}}
{{- fail "secrets.viewerToken: must differ from secrets.adminToken (the viewer token may not change anything)" -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and (eq .Values.redis.mode "sentinel") (not .Values.redis.masterName) -}}
{{- fail "redis.masterName: sentinel mode needs the master name the sentinels monitor" -}}
{{- end -}}
{{- end -}}

{{/* tollgate.failureShare: gateway.failureShare, or 1 / the largest fleet. */}}
{{- define "tollgate.failureShare" -}}
{{- if .Values.gateway.failureShare -}}
{{- .Values.gateway.failureShare -}}
{{- else -}}
{{- $n := ternary .Values.gateway.autoscaling.maxReplicas .Values.gateway.replicas .Values.gateway.autoscaling.enabled | int -}}
{{- divf 1 (max $n 1) | printf "%.4f" -}}
{{- end -}}
{{- end -}}

{{/* tollgate.secretEnv: a variable from the Secret. */}}
{{- define "tollgate.secretEnv" -}}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ include "tollgate.secretName" .root }}
      key: {{ .key }}
{{- end -}}

{{/* tollgate.commonEnv: what gateways and aggregators share: Redis, Kafka, NATS, the key secret, the rules, logs. */}}
{{- define "tollgate.commonEnv" -}}
- name: TOLLGATE_KEY_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "tollgate.secretName" . }}
      key: key-secret
- name: TOLLGATE_RULES_FILE
  value: /etc/tollgate/rules/rules.yaml
- name: TOLLGATE_DATA_DIR
  value: /var/lib/tollgate
- name: TOLLGATE_LOG_FORMAT
  value: json
- name: TOLLGATE_REDIS_MODE
  value: {{ .Values.redis.mode | quote }}
- name: TOLLGATE_REDIS_ADDRS
  value: {{ join "," .Values.redis.addrs | quote }}
{{- if eq .Values.redis.mode "sentinel" }}
- name: TOLLGATE_REDIS_MASTER_NAME
  value: {{ .Values.redis.masterName | quote }}
{{- end }}
{{- with .Values.redis.username }}
- name: TOLLGATE_REDIS_USERNAME
  value: {{ . | quote }}
{{- end }}
{{- if or .Values.secrets.existingSecret .Values.secrets.redisPassword }}
- name: TOLLGATE_REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "tollgate.secretName" . }}
      key: redis-password
      optional: true
{{- end }}
{{- if .Values.redis.tls }}
- name: TOLLGATE_REDIS_TLS
  value: "true"
{{- if .Values.redis.tlsCASecret }}
- name: TOLLGATE_REDIS_TLS_CA_FILE
  value: /etc/tollgate/redis-ca/ca.crt
{{- end }}
{{- end }}
- name: TOLLGATE_REDIS_DB
  value: {{ .Values.redis.db | quote }}
- name: TOLLGATE_REDIS_KEY_PREFIX
  value: {{ .Values.redis.keyPrefix | quote }}
- name: TOLLGATE_REDIS_TIMEOUT
  value: {{ .Values.redis.timeout | quote }}
{{- with .Values.kafka.brokers }}
- name: TOLLGATE_KAFKA_BROKERS
  value: {{ join "," . | quote }}
{{- end }}
- name: TOLLGATE_KAFKA_PARTITIONS
  value: {{ .Values.kafka.partitions | quote }}
{{- with .Values.nats.url }}
- name: TOLLGATE_NATS_URL
  value: {{ . | quote }}
{{- end }}
{{- end -}}

{{/* tollgate.extraEnv: a component's env map, sorted by name. */}}
{{- define "tollgate.extraEnv" -}}
{{- range $name := keys . | sortAlpha }}
- name: {{ $name }}
  value: {{ get $ $name | toString | quote }}
{{- end }}
{{- end -}}

{{/* tollgate.commonVolumes: the rules ConfigMap and the Redis CA. */}}
{{- define "tollgate.commonVolumes" -}}
- name: rules
  configMap:
    name: {{ include "tollgate.fullname" . }}-rules
{{- if and .Values.redis.tls .Values.redis.tlsCASecret }}
- name: redis-ca
  secret:
    secretName: {{ .Values.redis.tlsCASecret }}
    items:
      - key: ca.crt
        path: ca.crt
{{- end }}
{{- end -}}

{{- define "tollgate.commonMounts" -}}
- name: rules
  mountPath: /etc/tollgate/rules
  readOnly: true
- name: data
  mountPath: /var/lib/tollgate
- name: tmp
  mountPath: /tmp
{{- if and .Values.redis.tls .Values.redis.tlsCASecret }}
- name: redis-ca
  mountPath: /etc/tollgate/redis-ca
  readOnly: true
{{- end }}
{{- end -}}

{{/* tollgate.spread: the component's topology spread, by default over nodes and zones. */}}
{{- define "tollgate.spread" -}}
{{- if .values.topologySpreadConstraints }}
{{ toYaml .values.topologySpreadConstraints }}
{{- else }}
{{- range $key := list "kubernetes.io/hostname" "topology.kubernetes.io/zone" }}
- maxSkew: 1
  topologyKey: {{ $key }}
  whenUnsatisfiable: ScheduleAnyway
  labelSelector:
    matchLabels:
      {{- include "tollgate.selectorLabels" $.ctx | nindent 6 }}
{{- end }}
{{- end }}
{{- end -}}
