// Package kubernetes holds gpustore's Kubernetes manifests: a kustomize base
// and the overlays single (one StatefulSet with every role) and scaled (the
// ring: receivers, distributors, queriers, rulers, and the compactor apart),
// the opt-in component prometheus-operator (PodMonitor and PrometheusRules,
// the latter generated from deploy/rules/self by PrometheusRules), plus the
// Prometheus Operator HA-pair snippet. The test in this folder renders the
// overlays with kustomize's Go API and decodes every object strictly with
// the Kubernetes API types (and the Prometheus Operator's), and renders the
// Helm chart deploy/helm/gpustore through Helm's Go packages to compare it
// with the overlays; only the tests import them.
package kubernetes
