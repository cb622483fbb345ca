// Package selfrules holds gpustore's self-monitoring alerts
// (gpustore-*.yml): rules for the Prometheus that scrapes gpustore's own
// /metrics. They live apart from the GPU rule pack in the parent folder, which
// gpustore embeds and loads by default; these are never loaded into gpustore
// itself (a gpustore that is down cannot alert about being down). The tests
// check them with promtool and against the metrics the code really exports.
package selfrules
