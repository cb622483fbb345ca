{{/*
The name prefix of every object: the release name when it contains the
chart's name (release "gpustore": gpustore, gpustore-receiver, ...), else
<release>-gpustore.
*/}}
{{- define "gpustore.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* Labels that select a component's pods (root, component). */}}
{{- define "gpustore.selectorLabels" -}}
app.kubernetes.io/name: gpustore
app.kubernetes.io/instance: {{ .root.Release.Name }}
{{- with .component }}
app.kubernetes.io/component: {{ . }}
{{- end }}
{{- end -}}

{{/* Labels of every object (root, component). */}}
{{- define "gpustore.labels" -}}
{{ include "gpustore.selectorLabels" . }}
app.kubernetes.io/part-of: gpustore
app.kubernetes.io/version: {{ .root.Values.image.tag | default .root.Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpustore.bucketSecret" -}}
{{- .Values.bucket.secretName | default (printf "%s-bucket" (include "gpustore.fullname" .)) -}}
{{- end -}}

{{/* memberlist's seed: the gossip Service's A records (dskit's dns+). */}}
{{- define "gpustore.join" -}}
dns+{{ include "gpustore.fullname" . }}-gossip.{{ .Release.Namespace }}.svc.{{ .Values.clusterDomain }}:7946
{{- end -}}

{{/*
A gpustore pod template. Every workload is one gpustore container with the
same security context (Pod Security "restricted": non-root 65532, the image's
user; RuntimeDefault seccomp; no privilege escalation; no capabilities; a
read-only root filesystem, writes only under /data), the same config mount
and the same probes. Arguments (a dict):
  root       the chart's context
  component  app.kubernetes.io/component of the pods
  container  the container's name
  target     -target
  data       what /data is: "claim" (the StatefulSet's volume claim
             template), "emptyDir", "ephemeral" (a claim made and deleted with
             the pod) or "" (no data path, no bucket)
  dataSize   the emptyDir's sizeLimit or the ephemeral claim's size
  dataVolume the data volume's name (default data)
  rules      mount the rule files (rules.dir)
  ring       a ring member (--ring.enabled, gossip, the HA election)
  register   registers in a ring as its pod (name and IP)
  resources  the container's resources
  grace      terminationGracePeriodSeconds (optional)
  spread     spread the pods over nodes
  brief      only a liveness and a readiness probe (the compactor's)
  noItems    mount the whole config and bucket objects (the compactor's)
*/}}
{{- define "gpustore.podTemplate" -}}
{{- $root := .root -}}
{{- $v := $root.Values -}}
{{- $dataVolume := .dataVolume | default "data" -}}
{{- $zones := and (eq .component "receiver") (dig "ring" "zone_awareness_enabled" false $v.config) -}}
metadata:
  labels:
    {{- include "gpustore.labels" (dict "root" $root "component" .component) | nindent 4 }}
    {{- if .ring }}
    gpustore.io/ring: member
    {{- end }}
    {{- with $v.podLabels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  annotations:
    checksum/config: {{ include (print $root.Template.BasePath "/configmap.yaml") $root | sha256sum }}
    {{- with $v.podAnnotations }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  securityContext:
    runAsNonRoot: true
    runAsUser: 65532
    runAsGroup: 65532
    fsGroup: 65532
    seccompProfile:
      type: RuntimeDefault
  {{- with .grace }}
  terminationGracePeriodSeconds: {{ . }}
  {{- end }}
  {{- if .spread }}
  topologySpreadConstraints:
    - maxSkew: 1
      topologyKey: kubernetes.io/hostname
      whenUnsatisfiable: ScheduleAnyway
      labelSelector:
        matchLabels:
          {{- include "gpustore.selectorLabels" (dict "root" $root "component" .component) | nindent 10 }}
    {{- if $zones }}
    # As many receivers in each zone: each zone holds one copy of every series.
    - maxSkew: 1
      topologyKey: topology.kubernetes.io/zone
      whenUnsatisfiable: DoNotSchedule
      labelSelector:
        matchLabels:
          {{- include "gpustore.selectorLabels" (dict "root" $root "component" .component) | nindent 10 }}
    {{- end }}
  {{- end }}
  {{- with $v.imagePullSecrets }}
  imagePullSecrets:
    {{- range . }}
    - name: {{ . }}
    {{- end }}
  {{- end }}
  {{- with $v.nodeSelector }}
  nodeSelector:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.tolerations }}
  tolerations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with $v.affinity }}
  affinity:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  containers:
    - name: {{ .container }}
      image: {{ printf "%s:%s" $v.image.repository ($v.image.tag | default $root.Chart.AppVersion) | quote }}
      {{- with $v.image.pullPolicy }}
      imagePullPolicy: {{ . }}
      {{- end }}
      args:
        - --config.file=/etc/gpustore/config/gpustore.yml
        - --target={{ .target }}
        {{- if .data }}
        - --storage.tsdb.path=/data
        - --objstore.config-file=/etc/gpustore/bucket/objstore.yml
        {{- end }}
        {{- if .ring }}
        - --ring.enabled
        {{- if .register }}
        - --ring.instance-id=$(POD_NAME)
        - --ring.instance-addr=$(POD_IP):9201
        {{- if $zones }}
        - --ring.instance-zone=$(ZONE)
        {{- end }}
        {{- end }}
        - --memberlist.join={{ include "gpustore.join" $root }}
        - --memberlist.bind-port=7946
        - --ha-tracker.store=memberlist
        {{- end }}
        {{- range $v.extraArgs }}
        - {{ . | quote }}
        {{- end }}
      ports:
        - name: http
          containerPort: 9201
        {{- if .ring }}
        # memberlist: dskit gossips over TCP; UDP, memberlist's usual pair,
        # is declared but unused.
        - name: gossip
          containerPort: 7946
          protocol: TCP
        - name: gossip-udp
          containerPort: 7946
          protocol: UDP
        {{- end }}
      {{- if .register }}
      env:
        - name: POD_NAME
          valueFrom:
            fieldRef: {fieldPath: metadata.name}
        - name: POD_IP
          valueFrom:
            fieldRef: {fieldPath: status.podIP}
        {{- if $zones }}
        # The node's zone, copied onto the pod at binding
        # (PodTopologyLabelsAdmission: Kubernetes 1.35, or 1.33 with the gate).
        - name: ZONE
          valueFrom:
            fieldRef: {fieldPath: "metadata.labels['topology.kubernetes.io/zone']"}
        {{- end }}
      {{- end }}
      {{- if .brief }}
      livenessProbe:
        httpGet: {path: /-/healthy, port: http}
        periodSeconds: 15
      readinessProbe:
        httpGet: {path: /-/ready, port: http}
        periodSeconds: 10
      {{- else }}
      # /-/healthy answers during a long WAL replay; /-/ready once gpustore
      # serves.
      startupProbe:
        httpGet: {path: /-/healthy, port: http}
        periodSeconds: 5
        failureThreshold: 60
      livenessProbe:
        httpGet: {path: /-/healthy, port: http}
        periodSeconds: 15
        failureThreshold: 4
      readinessProbe:
        httpGet: {path: /-/ready, port: http}
        periodSeconds: 5
        failureThreshold: 3
      {{- end }}
      resources:
        {{- toYaml .resources | nindent 8 }}
      securityContext:
        allowPrivilegeEscalation: false
        readOnlyRootFilesystem: true
        capabilities:
          drop: [ALL]
      volumeMounts:
        {{- if .data }}
        - name: {{ $dataVolume }}
          mountPath: /data
        {{- end }}
        - name: config
          mountPath: /etc/gpustore/config
          readOnly: true
        {{- if .rules }}
        - name: rules
          mountPath: /etc/gpustore/rules
          readOnly: true
        {{- end }}
        {{- if .data }}
        - name: bucket
          mountPath: /etc/gpustore/bucket
          readOnly: true
        {{- end }}
  volumes:
    {{- if eq .data "emptyDir" }}
    - name: {{ $dataVolume }}
      emptyDir:
        sizeLimit: {{ .dataSize }}
    {{- else if eq .data "ephemeral" }}
    - name: {{ $dataVolume }}
      ephemeral:
        volumeClaimTemplate:
          spec:
            accessModes: [ReadWriteOnce]
            {{- with $v.storageClassName }}
            storageClassName: {{ . }}
            {{- end }}
            resources:
              requests:
                storage: {{ .dataSize }}
    {{- end }}
    - name: config
      configMap:
        name: {{ include "gpustore.fullname" $root }}-config
        {{- if not .noItems }}
        items:
          - key: gpustore.yml
            path: gpustore.yml
        {{- end }}
    {{- if .rules }}
    - name: rules
      configMap:
        name: {{ include "gpustore.fullname" $root }}-rules
    {{- end }}
    {{- if .data }}
    - name: bucket
      secret:
        secretName: {{ include "gpustore.bucketSecret" $root }}
        {{- if not .noItems }}
        items:
          - key: objstore.yml
            path: objstore.yml
        {{- end }}
    {{- end }}
{{- end -}}

{{/* The data volume claim template of a StatefulSet (root, size). */}}
{{- define "gpustore.dataClaim" -}}
volumeClaimTemplates:
  - metadata:
      name: data
    spec:
      accessModes: [ReadWriteOnce]
      {{- with .root.Values.storageClassName }}
      storageClassName: {{ . }}
      {{- end }}
      resources:
        requests:
          storage: {{ .size }}
{{- end -}}
