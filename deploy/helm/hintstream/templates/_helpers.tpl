{{/* Names, labels, and the configuration file both stages load. */}}

{{- define "hintstream.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "hintstream.fullname" -}}
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

{{/*
A stage's StatefulSet, Service and ScaledObject name: <fullname>-<stage>. Its
pods are <name>-0, <name>-1, ..., and each pod's name is its worker id (the
transactional id and static member id derive from it), so the name is never
truncated: a StatefulSet name may have at most 52 characters (its pods'
controller-revision-hash label adds 11 to a 63-character label).
(list $ "hints")
*/}}
{{- define "hintstream.stageName" -}}
{{- $root := index . 0 -}}
{{- $name := printf "%s-%s" (include "hintstream.fullname" $root) (index . 1) -}}
{{- if gt (len $name) 52 -}}
{{- fail (printf "the StatefulSet name %q is longer than 52 characters: choose a shorter release name or fullnameOverride" $name) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{- define "hintstream.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Labels of every object. */}}
{{- define "hintstream.labels" -}}
helm.sh/chart: {{ include "hintstream.chart" . }}
app.kubernetes.io/name: {{ include "hintstream.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: hintstream
{{- end -}}

{{/* Selector labels of one stage's pods. (list $ "hints") */}}
{{- define "hintstream.selectorLabels" -}}
{{- $root := index . 0 -}}
app.kubernetes.io/name: {{ include "hintstream.name" $root }}
app.kubernetes.io/instance: {{ $root.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "hintstream.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "hintstream.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "hintstream.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{/* Each stage's metrics, /healthz and /readyz port (the image's EXPOSE). */}}
{{- define "hintstream.metricsPort" -}}
{{- if eq . "hints" }}9464{{ else }}9465{{ end -}}
{{- end -}}

{{/* Whether SASL / TLS is on. */}}
{{- define "hintstream.sasl" -}}
{{- if hasPrefix "SASL_" .Values.kafka.security.protocol }}true{{ end -}}
{{- end -}}
{{- define "hintstream.tls" -}}
{{- if has .Values.kafka.security.protocol (list "SSL" "SASL_SSL") }}true{{ end -}}
{{- end -}}

{{/*
Whether the consumers are static members: kafka.staticMembership, where
"auto" is on with a fixed worker count and off under KEDA (docs/BENCHMARKS.md,
"Autoscaling on consumer lag": a removed static member's partitions wait a
session timeout, and KEDA removes workers after every burst).
*/}}
{{- define "hintstream.staticMembership" -}}
{{- $static := .Values.kafka.staticMembership -}}
{{- if eq (toString $static) "auto" -}}
{{- $static = not .Values.keda.enabled -}}
{{- end -}}
{{- if $static }}true{{ else }}false{{ end -}}
{{- end -}}

{{/* KEDA's name of the SASL mechanism. */}}
{{- define "hintstream.kedaSasl" -}}
{{- $names := dict "PLAIN" "plaintext" "SCRAM-SHA-256" "scram_sha256" "SCRAM-SHA-512" "scram_sha512" -}}
{{- $name := get $names .Values.kafka.security.saslMechanism -}}
{{- if not $name -}}
{{- fail (printf "kafka.security.saslMechanism %q must be PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512" .Values.kafka.security.saslMechanism) -}}
{{- end -}}
{{- $name -}}
{{- end -}}

{{/* Where the TLS Secret is mounted. */}}
{{- define "hintstream.tlsDir" -}}/etc/hintstream-tls{{- end -}}

{{/*
The configuration as a dict (JSON): config, with what the chart owns set from
its values. Refuses values that set a chart-owned key in two places.
*/}}
{{- define "hintstream.configData" -}}
{{- $v := .Values -}}
{{- $config := deepCopy ($v.config | default dict) -}}
{{- range $key := list "bootstrap_servers" "kafka" -}}
{{- if hasKey $config $key -}}
{{- fail (printf "config.%s is set by the chart: use the kafka values (kafka.bootstrapServers, kafka.properties, kafka.consumer, kafka.producer, kafka.delivery, ...)" $key) -}}
{{- end -}}
{{- end -}}
{{- $kafka := deepCopy ($v.kafka.properties | default dict) -}}
{{- $consumer := deepCopy ($v.kafka.consumer | default dict) -}}
{{- $producer := deepCopy ($v.kafka.producer | default dict) -}}
{{- range $table := list $kafka $consumer -}}
{{- range $key := list "session.timeout.ms" "group.protocol" "security.protocol" "sasl.mechanism" "sasl.username" "sasl.password" "ssl.ca.location" -}}
{{- if hasKey $table $key -}}
{{- fail (printf "kafka.properties/kafka.consumer: %q is set by the chart (kafka.sessionTimeoutMs, kafka.groupProtocol, kafka.security)" $key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $sec := $v.kafka.security -}}
{{- if not (has $sec.protocol (list "PLAINTEXT" "SSL" "SASL_PLAINTEXT" "SASL_SSL")) -}}
{{- fail (printf "kafka.security.protocol %q must be PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL" $sec.protocol) -}}
{{- end -}}
{{- $_ := set $kafka "security.protocol" $sec.protocol -}}
{{- if include "hintstream.sasl" . -}}
{{- if not $sec.sasl.existingSecret -}}
{{- fail (printf "kafka.security.protocol %s needs kafka.security.sasl.existingSecret (a Secret with the SASL user name and password)" $sec.protocol) -}}
{{- end -}}
{{- $_ := include "hintstream.kedaSasl" . -}}
{{- $_ := set $kafka "sasl.mechanism" $sec.saslMechanism -}}
{{- $_ := set $kafka "sasl.username" "${KAFKA_SASL_USERNAME}" -}}
{{- $_ := set $kafka "sasl.password" "${KAFKA_SASL_PASSWORD}" -}}
{{- end -}}
{{- if $sec.tls.existingSecret -}}
{{- $_ := set $kafka "ssl.ca.location" (printf "%s/%s" (include "hintstream.tlsDir" .) $sec.tls.caKey) -}}
{{- if $sec.tls.certKey -}}
{{- $_ := set $kafka "ssl.certificate.location" (printf "%s/%s" (include "hintstream.tlsDir" .) $sec.tls.certKey) -}}
{{- $_ := set $kafka "ssl.key.location" (printf "%s/%s" (include "hintstream.tlsDir" .) $sec.tls.keyKey) -}}
{{- end -}}
{{- end -}}
{{- if not (has $v.kafka.delivery (list "at_least_once" "exactly_once")) -}}
{{- fail (printf "kafka.delivery %q must be at_least_once or exactly_once" $v.kafka.delivery) -}}
{{- end -}}
{{- $_ := set $kafka "delivery" $v.kafka.delivery -}}
{{- $_ := set $kafka "static_membership" (eq (include "hintstream.staticMembership" .) "true") -}}
{{- if eq $v.kafka.groupProtocol "consumer" -}}
{{- $_ := set $consumer "group.protocol" "consumer" -}}
{{- else if eq $v.kafka.groupProtocol "classic" -}}
{{- $_ := set $consumer "session.timeout.ms" $v.kafka.sessionTimeoutMs -}}
{{- else -}}
{{- fail (printf "kafka.groupProtocol %q must be classic or consumer" $v.kafka.groupProtocol) -}}
{{- end -}}
{{- if $consumer -}}{{- $_ := set $kafka "consumer" $consumer -}}{{- end -}}
{{- if $producer -}}{{- $_ := set $kafka "producer" $producer -}}{{- end -}}
{{- $_ := set $config "bootstrap_servers" $v.kafka.bootstrapServers -}}
{{- $_ := set $config "kafka" $kafka -}}
{{- $topics := deepCopy ($config.topics | default dict) -}}
{{- $_ := set $topics "partitions" $v.topics.partitions -}}
{{- $_ := set $topics "replication_factor" $v.topics.replicationFactor -}}
{{- $_ := set $config "topics" $topics -}}
{{- range $stage := list "hints" "advantages" -}}
{{- $section := deepCopy (index $config $stage | default dict) -}}
{{- range $key := list "group_id" "input_topic" "metrics_addr" -}}
{{- if hasKey $section $key -}}
{{- fail (printf "config.%s.%s is set by the chart: use %s.groupId / %s.inputTopic (metrics_addr is the pod's port %s)" $stage $key $stage $stage (include "hintstream.metricsPort" $stage)) -}}
{{- end -}}
{{- end -}}
{{- $values := index $v $stage -}}
{{- $_ := set $section "group_id" $values.groupId -}}
{{- $_ := set $section "input_topic" $values.inputTopic -}}
{{- $_ := set $section "metrics_addr" (printf "0.0.0.0:%s" (include "hintstream.metricsPort" $stage)) -}}
{{- $_ := set $config $stage $section -}}
{{- end -}}
{{- toJson $config -}}
{{- end -}}

{{/* A TOML key: bare when it can be, else quoted. */}}
{{- define "hintstream.tomlKey" -}}
{{- if regexMatch "^[A-Za-z0-9_-]+$" . -}}{{ . }}{{- else -}}{{ toJson . }}{{- end -}}
{{- end -}}

{{/*
A TOML value. Numbers come through JSON as float64: a whole one is written
as an integer (hintstream's integer settings refuse 20.0; its float
settings take 1 as 1.0).
*/}}
{{- define "hintstream.tomlValue" -}}
{{- if kindIs "map" . -}}
{ {{- $first := true -}}
{{- range $k, $v := . -}}
{{- if not $first }}, {{ else }} {{ end -}}{{- $first = false -}}
{{ include "hintstream.tomlKey" $k }} = {{ include "hintstream.tomlValue" $v }}
{{- end }} }
{{- else if kindIs "slice" . -}}
[{{- range $i, $v := . -}}{{ if $i }}, {{ end }}{{ include "hintstream.tomlValue" $v }}{{- end -}}]
{{- else if kindIs "string" . -}}
{{- toJson . -}}
{{- else if kindIs "bool" . -}}
{{- . -}}
{{- else if kindIs "float64" . -}}
{{- if eq . (floor .) -}}{{ int64 . }}{{- else -}}{{ . }}{{- end -}}
{{- else if kindIs "invalid" . -}}
{{- fail "hintstream.toml cannot hold a null: remove the key instead" -}}
{{- else -}}
{{- . -}}
{{- end -}}
{{- end -}}

{{/* A TOML table's body and its sub-tables. (list "prefix" dict) */}}
{{- define "hintstream.tomlTable" -}}
{{- $prefix := index . 0 -}}
{{- $table := index . 1 -}}
{{- range $k, $v := $table -}}
{{- if not (kindIs "map" $v) }}
{{ include "hintstream.tomlKey" $k }} = {{ include "hintstream.tomlValue" $v }}
{{- end -}}
{{- end -}}
{{- range $k, $v := $table -}}
{{- if kindIs "map" $v -}}
{{- $name := include "hintstream.tomlKey" $k -}}
{{- if $prefix }}{{ $name = printf "%s.%s" $prefix $name }}{{ end }}

[{{ $name }}]
{{- include "hintstream.tomlTable" (list $name $v) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* hintstream.toml. */}}
{{- define "hintstream.toml" -}}
# Rendered by the hintstream Helm chart from its values.
{{- include "hintstream.tomlTable" (list "" (include "hintstream.configData" . | fromJson)) }}
{{ end -}}

{{/* The Kafka credentials' environment variables. */}}
{{- define "hintstream.kafkaEnv" -}}
{{- if include "hintstream.sasl" . -}}
- name: KAFKA_SASL_USERNAME
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.security.sasl.existingSecret }}
      key: {{ .Values.kafka.security.sasl.usernameKey }}
- name: KAFKA_SASL_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ .Values.kafka.security.sasl.existingSecret }}
      key: {{ .Values.kafka.security.sasl.passwordKey }}
{{- end -}}
{{- end -}}

{{/* The config volume and, with TLS, the certificates'. (list $ configMapName) */}}
{{- define "hintstream.volumes" -}}
{{- $root := index . 0 -}}
- name: config
  configMap:
    name: {{ index . 1 }}
- name: tmp
  emptyDir: {}
{{- if $root.Values.kafka.security.tls.existingSecret }}
- name: kafka-tls
  secret:
    secretName: {{ $root.Values.kafka.security.tls.existingSecret }}
{{- end }}
{{- end -}}

{{- define "hintstream.volumeMounts" -}}
- name: config
  mountPath: /etc/hintstream
  readOnly: true
- name: tmp
  mountPath: /tmp
{{- if .Values.kafka.security.tls.existingSecret }}
- name: kafka-tls
  mountPath: {{ include "hintstream.tlsDir" . }}
  readOnly: true
{{- end }}
{{- end -}}
