package grafana

import (
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// quantile is histogram_quantile over a classic histogram, only where it
// had observations: with none in the window every bucket's rate is 0 and the
// quantile would be NaN.
func quantile(phi float64, hist, sel string) string {
	return fmt.Sprintf(`histogram_quantile(%g, sum by (le) (rate(%s_bucket{%s}[$__rate_interval]))) and on () (sum(rate(%s_count{%s}[$__rate_interval])) > 0)`,
		phi, hist, sel, hist, sel)
}

// gpustoreOperations is gpustore's own dashboard, from its /metrics as
// scraped by the Prometheus pair (job "gpustore"). The TSDB's metrics are
// Prometheus' names with a tenant label.
func gpustoreOperations() *dashboard.DashboardBuilder {
	const inst = `job=~"gpustore.*", instance=~"$instance"`
	return newDashboard("gpustore-operations", "gpustore operations",
		"gpustore itself: ingest and rejections, HA election, head, WAL and shipper backlog, bucket store, compaction, queries. Alerts: deploy/rules/self.", "operations").
		WithVariable(labelVar("instance", "instance", "gpustore_ingest_requests_total", "", true)).
		WithPanel(timeSeries("Ingest rate", "Samples, histograms and exemplars committed per second, by type.", unitPerSecond,
			q(`sum by (type) (rate(gpustore_ingest_written_total{`+inst+`}[$__rate_interval]))`, "{{type}}")).Min(0)).
		WithPanel(timeSeries("Rejected samples by reason", "Samples answered 4xx (lost: senders do not retry them), by reason.", unitPerSecond,
			q(`sum by (reason) (rate(gpustore_ingest_rejected_samples_total{`+inst+`}[$__rate_interval]))`, "{{reason}}")).Min(0)).
		WithPanel(timeSeries("Remote-write requests by status", "Requests per second by HTTP status: 5xx are retried by the sender.", unitReqPerSec,
			q(`sum by (code) (rate(gpustore_ingest_requests_total{`+inst+`}[$__rate_interval]))`, "{{code}}")).Min(0)).
		WithPanel(timeSeries("Remote-write latency", "Time to decode, append and commit one request.", unitSeconds,
			q(quantile(0.99, "gpustore_ingest_request_duration_seconds", inst), "p99"),
			q(quantile(0.5, "gpustore_ingest_request_duration_seconds", inst), "p50")).Min(0)).
		WithPanel(timeSeries("HA elected replica", "1 for the replica elected per cluster; a change is a failover.", unitCount,
			q(`max by (tenant, cluster, replica) (gpustore_ha_elected_replica{`+inst+`})`, "{{cluster}} {{replica}}")).Min(0).Max(1)).
		WithPanel(timeSeries("HA elections", "Elections (the first and failovers) in the last hour, per cluster.", unitCount,
			q(`sum by (tenant, cluster) (increase(gpustore_ha_elected_replica_changes_total{`+inst+`}[1h]))`, "{{cluster}}")).Min(0)).
		WithPanel(timeSeries("Head series", "Series in each tenant's head (memory).", unitCount,
			q(`sum by (tenant) (gpustore_tsdb_head_series{`+inst+`})`, "{{tenant}}")).Min(0)).
		WithPanel(timeSeries("WAL size", "Size of each tenant's write-ahead log on disk.", unitBytes,
			q(`sum by (tenant) (prometheus_tsdb_wal_storage_size_bytes{`+inst+`, tenant!=""})`, "{{tenant}}")).Min(0)).
		WithPanel(timeSeries("Shipper backlog", "Blocks cut but not yet in the bucket, and the age of the oldest.", unitCount,
			q(`sum by (tenant) (gpustore_shipper_pending_blocks{`+inst+`})`, "{{tenant}} pending blocks")).Min(0)).
		WithPanel(timeSeries("Oldest block awaiting upload", "0 when nothing waits; alert GpustoreShipperBacklog past 1h.", unitSeconds,
			q(`max by (tenant) (gpustore_shipper_oldest_pending_block_age_seconds{`+inst+`})`, "{{tenant}}")).Min(0)).
		WithPanel(timeSeries("Bucket-store cache", "Bytes held by the query page cache, and its bound.", unitBytes,
			q(`sum(gpustore_bucketstore_cache_bytes{`+inst+`})`, "used"),
			q(`sum(gpustore_bucketstore_cache_max_bytes{`+inst+`})`, "max")).Min(0)).
		WithPanel(timeSeries("Bucket-store cache hits and misses", "Page cache lookups per second.", unitPerSecond,
			q(`sum(rate(gpustore_bucketstore_cache_hits_total{`+inst+`}[$__rate_interval]))`, "hits"),
			q(`sum(rate(gpustore_bucketstore_cache_misses_total{`+inst+`}[$__rate_interval]))`, "misses")).Min(0)).
		WithPanel(timeSeries("Bucket sync age", "Time since the bucket store last listed the bucket.", unitSeconds,
			q(`time() - max(gpustore_bucketstore_last_sync_timestamp_seconds{`+inst+`} > 0)`, "since last sync")).Min(0)).
		WithPanel(timeSeries("Compaction", "Per tenant: 1 while its compaction passes fail (retried every pass); hours since its last successful pass.", unitCount,
			q(`max by (tenant) (gpustore_compact_halted{`+inst+`})`, "{{tenant}} failing"),
			q(`(time() - max by (tenant) (gpustore_compact_last_success_timestamp_seconds{`+inst+`})) / 3600`, "{{tenant}} hours since last pass")).Min(0)).
		// A summary's quantile is NaN while a slice had no query in its
		// window: >= 0 drops those points instead of drawing NaN.
		WithPanel(timeSeries("Query latency", "90th percentile of PromQL evaluation time (queries and rules) over the last 10 minutes, by stage.", unitSeconds,
			q(`max by (slice) (prometheus_engine_query_duration_seconds{`+inst+`, quantile="0.9"} >= 0)`, "{{slice}}")).Min(0))
}
