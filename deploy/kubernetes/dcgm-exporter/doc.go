// Package dcgmexporter holds the dcgm-exporter counters CSV that gpustore's
// GPU rule pack (deploy/rules) and Grafana dashboards (deploy/grafana) read,
// shipped as a kustomize ConfigMap. The test in this folder checks that every
// field in it is one dcgm-exporter 4.5.3-4.8.2 accepts (testdata lists them),
// that the file parses as the exporter parses it, and that it exports every
// DCGM metric the pack and the dashboards query.
package dcgmexporter
