package grafana

import (
	"fmt"

	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// quantile is histogram_quantile over a classic histogram, only where it
// had observations: with none in the window every bucket's rate is 0 and the
// quantile would be NaN.
func quantile(phi float64, hist, sel string) string {
	return fmt.Sprintf(`histogram_quantile(%g, sum by (le) (rate(%s_bucket{%s}[$__rate_interval]))) and on () (sum(rate(%s_count{%s}[$__rate_interval])) > 0)`,
		phi, hist, sel, hist, sel)
}

// quantileBy is quantile per the values of the label by.
func quantileBy(phi float64, hist, sel, by string) string {
	return fmt.Sprintf(`histogram_quantile(%g, sum by (le, %s) (rate(%s_bucket{%s}[$__rate_interval]))) and on (%s) (sum by (%s) (rate(%s_count{%s}[$__rate_interval])) > 0)`,
		phi, by, hist, sel, by, by, hist, sel)
}

// rateBy is the per-second rate of a counter summed by the labels of by.
func rateBy(by, metric, sel string) string {
	return fmt.Sprintf(`sum by (%s) (rate(%s{%s}[$__rate_interval]))`, by, metric, sel)
}

// opsPanel is a third of the width: three panels to a line.
func opsPanel(title, desc, unit string, targets ...string) *timeseries.PanelBuilder {
	if len(targets)%2 != 0 {
		panic("opsPanel: targets are expression, legend pairs")
	}
	p := timeSeries(title, desc, unit).Span(8).Height(7).Min(0)
	for i := 0; i < len(targets); i += 2 {
		p = p.WithTarget(q(targets[i], targets[i+1]).RefId(string(rune('A' + i/2))))
	}
	return p
}

// Selectors of the operations dashboard: gpustore's processes by the job
// and instance variables. ingestSel is the write path's own requests: a
// single node's (no stage label) or the distributors', not the receivers'
// copies (stage="receiver", each sample once per replica) nor the rulers'
// results (stage="rules").
const (
	opsSel    = `job=~"$job", instance=~"$instance"`
	ingestSel = opsSel + `, stage!~"receiver|rules"`
	bucketSel = opsSel + `, bucket="gpustore"`
	tenantSel = opsSel + `, tenant!=""` // Prometheus' TSDB, rule and notifier metrics as gpustore labels them
)

// gpustoreOperations is gpustore's own dashboard, from its /metrics as
// scraped by the Prometheus that watches it (any job name: the job
// variable lists the jobs of targets that export gpustore's metrics). A
// row per component of the write and read paths, then the process'
// resources; the self-alerts (deploy/rules/self) read the same series.
func gpustoreOperations() *dashboard.DashboardBuilder {
	b := newDashboard("gpustore-operations", "gpustore operations",
		"gpustore itself, a row per component: write path (distributor), ring, receiver (TSDB, shipper), object storage, querier, ruler, compactor, process resources. Alerts and runbook: deploy/rules/self, docs/runbook.md.", "operations").
		WithVariable(labelVar("job", "job", "gpustore_process_memory_limit_bytes", "", true)).
		WithVariable(labelVar("instance", "instance", "gpustore_process_memory_limit_bytes", `job=~"$job"`, true)).
		WithPanel(statPanel("Processes up", "gpustore targets the watching Prometheus scrapes successfully.", unitCount,
			q(`sum(up{`+opsSel+`})`, "")).Span(6)).
		WithPanel(statPanel("Samples written", "Samples per second the write path commits (a single node's or the distributors'; not the receivers' replicas).", unitPerSecond,
			q(`sum(rate(gpustore_ingest_written_total{`+ingestSel+`, type="sample"}[$__rate_interval]))`, "")).Span(6)).
		WithPanel(statPanel("Series in heads", "Series in the TSDB heads of every tenant (with the ring: every replica).", unitCount,
			q(`sum(gpustore_tsdb_head_series{`+opsSel+`})`, "")).Span(6)).
		WithPanel(statPanel("Query requests", "Requests per second to the query API, every route.", unitReqPerSec,
			q(`sum(rate(gpustore_query_http_requests_total{`+opsSel+`}[$__rate_interval]))`, "")).Span(6))
	for _, row := range opsRows() {
		b = b.WithRow(dashboard.NewRowBuilder(row.title))
		for _, p := range row.panels {
			b = b.WithPanel(p)
		}
	}
	return b
}

type opsRow struct {
	title  string
	panels []*timeseries.PanelBuilder
}

func opsRows() []opsRow {
	return []opsRow{
		{"Write path (distributor)", writePathPanels()},
		{"Ring and replication", ringPanels()},
		{"Receiver: TSDB and shipper", receiverPanels()},
		{"Cardinality: top offenders", cardinalityPanels()},
		{"Object storage", objstorePanels()},
		{"Querier", querierPanels()},
		{"Ruler", rulerPanels()},
		{"Compactor", compactorPanels()},
		{"Process resources", resourcePanels()},
	}
}

func writePathPanels() []*timeseries.PanelBuilder {
	return []*timeseries.PanelBuilder{
		opsPanel("Remote-write requests by status", "Requests per second by HTTP status: 5xx and 429 are retried by the sender, other 4xx are lost.", unitReqPerSec,
			rateBy("code", "gpustore_ingest_requests_total", ingestSel), "{{code}}"),
		opsPanel("Remote-write latency", "Time to decode, append and commit (or replicate) one request.", unitSeconds,
			quantile(0.99, "gpustore_ingest_request_duration_seconds", ingestSel), "p99",
			quantile(0.5, "gpustore_ingest_request_duration_seconds", ingestSel), "p50"),
		opsPanel("Samples written by type", "Samples, histograms and exemplars committed per second.", unitPerSecond,
			rateBy("type", "gpustore_ingest_written_total", ingestSel), "{{type}}"),
		opsPanel("Rejected samples by reason", "Samples answered 4xx (lost: senders do not retry them), by reason.", unitPerSecond,
			rateBy("reason", "gpustore_ingest_rejected_samples_total", ingestSel), "{{reason}}"),
		opsPanel("HA elected replica", "1 for the replica elected per cluster; a change is a failover.", unitCount,
			`max by (tenant, cluster, replica) (gpustore_ha_elected_replica{`+opsSel+`})`, "{{cluster}} {{replica}}").Max(1),
		opsPanel("HA elections", "Elections (the first and failovers) in the last hour, per cluster.", unitCount,
			`sum by (tenant, cluster) (increase(gpustore_ha_elected_replica_changes_total{`+opsSel+`}[1h]))`, "{{cluster}}"),
	}
}

func ringPanels() []*timeseries.PanelBuilder {
	return []*timeseries.PanelBuilder{
		opsPanel("Ring members by state", "Members of each ring (receiver, distributor, ruler) as the processes see them; Unhealthy ones missed their heartbeats.", unitCount,
			`max by (name, state) (ring_members{`+opsSel+`}) > 0`, "{{name}} {{state}}"),
		opsPanel("Replicated writes by result", "Distributor writes: ok (a quorum took every series), rejected (400), no_quorum (503, retried).", unitReqPerSec,
			rateBy("result", "gpustore_distributor_writes_total", opsSel), "{{result}}"),
		opsPanel("Writes to receivers by status", "The distributors' requests to receivers, one per replica; error: no answer.", unitReqPerSec,
			rateBy("status", "gpustore_distributor_receiver_requests_total", opsSel), "{{status}}"),
		opsPanel("Receiver write latency", "Time a receiver took to commit a distributor's write.", unitSeconds,
			quantile(0.99, "gpustore_distributor_receiver_request_duration_seconds", opsSel), "p99",
			quantile(0.5, "gpustore_distributor_receiver_request_duration_seconds", opsSel), "p50"),
		opsPanel("Series replicas sent", "Series per second the distributors' writes carried to receivers that took them, one per replica.", unitPerSecond,
			`sum(rate(gpustore_distributor_series_sent_total{`+opsSel+`}[$__rate_interval]))`, "series"),
		opsPanel("Reads from receivers by status", "The queriers' and rulers' remote reads of receivers.", unitReqPerSec,
			rateBy("status", "gpustore_receivers_read_requests_total", opsSel), "{{status}}"),
	}
}

func receiverPanels() []*timeseries.PanelBuilder {
	return []*timeseries.PanelBuilder{
		opsPanel("Head series", "Series in each tenant's head (memory).", unitCount,
			`sum by (tenant) (gpustore_tsdb_head_series{`+opsSel+`})`, "{{tenant}}"),
		opsPanel("Head span", "Time the head covers; the TSDB cuts a block past 1.5 block durations, so more means blocks wait to be cut.", unitSeconds,
			`max by (tenant) (gpustore_tsdb_head_span_seconds{`+opsSel+`})`, "{{tenant}}"),
		opsPanel("WAL size", "Size of each tenant's write-ahead log on disk.", unitBytes,
			`sum by (tenant) (prometheus_tsdb_wal_storage_size_bytes{`+tenantSel+`})`, "{{tenant}}"),
		opsPanel("Shipper backlog", "Blocks cut but not yet in the bucket.", unitCount,
			`sum by (tenant) (gpustore_shipper_pending_blocks{`+opsSel+`})`, "{{tenant}}"),
		opsPanel("Oldest block awaiting upload", "0 when nothing waits; GpustoreShipperBacklog past 1h.", unitSeconds,
			`max by (tenant) (gpustore_shipper_oldest_pending_block_age_seconds{`+opsSel+`})`, "{{tenant}}"),
		opsPanel("Blocks uploaded and failed uploads", "In the last hour, every tenant.", unitCount,
			`sum(increase(gpustore_shipper_uploaded_blocks_total{`+opsSel+`}[1h]))`, "uploaded",
			`sum(increase(gpustore_shipper_upload_failures_total{`+opsSel+`}[1h]))`, "failed"),
	}
}

// cardinalityPanels show which metric blew up, and what the cardinality
// limits refused: the API (/api/v1/cardinality/label_values?label_names[]=pod)
// then names the label (docs/limits.md).
func cardinalityPanels() []*timeseries.PanelBuilder {
	return []*timeseries.PanelBuilder{
		opsPanel("Top metrics by head series", "The 10 metric names with the most series in the heads, of every tenant (each tenant's 10 are exported); max_series_per_metric bounds them.", unitCount,
			`topk(10, max by (tenant, metric) (gpustore_tsdb_head_top_metric_series{`+opsSel+`}))`, "{{tenant}} {{metric}}"),
		opsPanel("Series created today", "Series each tenant's head created since the UTC day began (job churn: a new pod label re-creates every GPU's series); max_new_series_per_day bounds them.", unitCount,
			`max by (tenant) (gpustore_tsdb_head_series_created_today{`+opsSel+`})`, "{{tenant}}"),
		opsPanel("Samples refused by series limits", "New series' samples answered 400 by max_active_series, max_series_per_metric or max_new_series_per_day, per tenant.", unitPerSecond,
			`sum by (tenant, reason) (rate(gpustore_ingest_rejected_samples_total{`+ingestSel+`, reason=~"max_active_series|max_series_per_metric|max_new_series_per_day"}[$__rate_interval]))`, "{{tenant}} {{reason}}"),
	}
}

func objstorePanels() []*timeseries.PanelBuilder {
	return []*timeseries.PanelBuilder{
		opsPanel("Object-store operations", "Operations per second on the bucket, by operation.", unitPerSecond,
			rateBy("operation", "objstore_bucket_operations_total", bucketSel), "{{operation}}"),
		opsPanel("Object-store failures", "Failed operations per second (a missing object gpustore expects may be missing is none); GpustoreObjectStoreErrors past 5%.", unitPerSecond,
			rateBy("operation", "objstore_bucket_operation_failures_total", bucketSel), "{{operation}}"),
		opsPanel("Object-store latency", "99th percentile of an operation's duration.", unitSeconds,
			quantileBy(0.99, "objstore_bucket_operation_duration_seconds", bucketSel, "operation"), "{{operation}}"),
		opsPanel("Object-store bytes", "Bytes per second read and uploaded.", unitBytesPerSec,
			rateBy("operation", "objstore_bucket_operation_fetched_bytes_total", bucketSel), "{{operation}}"),
		opsPanel("Bucket sync age", "Time since the bucket store last listed the bucket.", unitSeconds,
			`time() - max(gpustore_bucketstore_last_sync_timestamp_seconds{`+opsSel+`} > 0)`, "since last sync"),
		opsPanel("Bucket-store cache", "Bytes held by the query page cache, and its bound.", unitBytes,
			`sum(gpustore_bucketstore_cache_bytes{`+opsSel+`})`, "used",
			`sum(gpustore_bucketstore_cache_max_bytes{`+opsSel+`})`, "max"),
	}
}

// apiShare is the share of a route's requests answered with codes
// matching re: 0, not nothing, for a route without such answers; nothing
// (not NaN) for a route without requests in the window.
func apiShare(re string) string {
	all := rateBy("handler", "gpustore_query_http_requests_total", opsSel)
	some := rateBy("handler", "gpustore_query_http_requests_total", opsSel+`, code=~"`+re+`"`)
	return fmt.Sprintf(`(%s or %s * 0) / (%s > 0)`, some, all, all)
}

func querierPanels() []*timeseries.PanelBuilder {
	return []*timeseries.PanelBuilder{
		opsPanel("Query API requests by route", "Requests per second by Prometheus' route (handler).", unitReqPerSec,
			rateBy("handler", "gpustore_query_http_requests_total", opsSel), "{{handler}}"),
		opsPanel("Query API requests by status", "Requests per second by HTTP status, every route.", unitReqPerSec,
			rateBy("code", "gpustore_query_http_requests_total", opsSel), "{{code}}"),
		opsPanel("Query API server errors by route", "Share of a route's requests answered 5xx; GpustoreQueryServerErrors past 5%.", unitPercentUnit,
			apiShare("5.."), "{{handler}}").Max(1),
		opsPanel("Query API latency by route", "99th percentile from a request's headers to the end of its answer.", unitSeconds,
			quantileBy(0.99, "gpustore_query_http_request_duration_seconds", opsSel, "handler"), "{{handler}}"),
		// A summary's quantile is NaN while a slice had no query in its
		// window: >= 0 drops those points instead of drawing NaN.
		opsPanel("PromQL evaluation latency", "90th percentile of PromQL evaluation time (queries and rules) over the last 10 minutes, by stage.", unitSeconds,
			`max by (slice) (prometheus_engine_query_duration_seconds{`+opsSel+`, quantile="0.9"} >= 0)`, "{{slice}}"),
		opsPanel("Results cache", "query_range day pieces answered from the cache and computed.", unitPerSecond,
			`sum(rate(gpustore_query_frontend_cache_hits_total{`+opsSel+`}[$__rate_interval]))`, "hits",
			`sum(rate(gpustore_query_frontend_cache_misses_total{`+opsSel+`}[$__rate_interval]))`, "misses"),
	}
}

func rulerPanels() []*timeseries.PanelBuilder {
	return []*timeseries.PanelBuilder{
		opsPanel("Rule evaluations", "Rule evaluations per second, and those that failed.", unitPerSecond,
			`sum(rate(prometheus_rule_evaluations_total{`+tenantSel+`}[$__rate_interval]))`, "evaluations",
			`sum(rate(prometheus_rule_evaluation_failures_total{`+tenantSel+`}[$__rate_interval]))`, "failures"),
		opsPanel("Slowest rule group", "The longest last evaluation of a tenant's rule groups; past its interval, evaluations are skipped.", unitSeconds,
			`max by (tenant) (prometheus_rule_group_last_duration_seconds{`+tenantSel+`})`, "{{tenant}}"),
		opsPanel("Missed rule evaluations", "Evaluations skipped in the last hour because a group took longer than its interval.", unitCount,
			`sum by (tenant) (increase(prometheus_rule_group_iterations_missed_total{`+tenantSel+`}[1h]))`, "{{tenant}}"),
		opsPanel("Alert notifications", "Alerts sent to Alertmanager per second, failed and dropped.", unitPerSecond,
			`sum(rate(prometheus_notifications_sent_total{`+tenantSel+`}[$__rate_interval]))`, "sent",
			`sum(rate(prometheus_notifications_errors_total{`+tenantSel+`}[$__rate_interval]))`, "errors",
			`sum(rate(prometheus_notifications_dropped_total{`+tenantSel+`}[$__rate_interval]))`, "dropped"),
		opsPanel("Notification queue", "Alerts waiting to be sent, and the queue's capacity (beyond it they are dropped).", unitCount,
			`max(prometheus_notifications_queue_length{`+tenantSel+`})`, "queued",
			`max(prometheus_notifications_queue_capacity{`+tenantSel+`})`, "capacity"),
		opsPanel("Rule reloads", "1 while the last reload of a tenant's rule files succeeded.", unitCount,
			`min by (tenant) (gpustore_rules_config_last_reload_successful{`+opsSel+`})`, "{{tenant}}").Max(1),
	}
}

func compactorPanels() []*timeseries.PanelBuilder {
	return []*timeseries.PanelBuilder{
		opsPanel("Compaction", "Per tenant: 1 while its compaction passes fail (retried every pass); hours since its last successful pass.", unitCount,
			`max by (tenant) (gpustore_compact_last_pass_failed{`+opsSel+`})`, "{{tenant}} failing",
			`(time() - max by (tenant) (gpustore_compact_last_success_timestamp_seconds{`+opsSel+`})) / 3600`, "{{tenant}} hours since last pass"),
		opsPanel("Blocks compacted and downsampled", "In the last hour, every tenant.", unitCount,
			`sum(increase(gpustore_compact_blocks_compacted_total{`+opsSel+`}[1h]))`, "compacted",
			`sum(increase(gpustore_downsample_blocks_total{`+opsSel+`}[1h]))`, "downsampled"),
		opsPanel("Blocks marked no-compact", "Blocks the compactor could not read, per tenant; GpustoreBlocksMarkedNoCompact.", unitCount,
			`max by (tenant) (gpustore_compact_no_compact_blocks{`+opsSel+`})`, "{{tenant}}"),
		opsPanel("Compaction pass duration", "99th percentile of a pass over every tenant.", unitSeconds,
			quantile(0.99, "gpustore_compact_pass_duration_seconds", opsSel), "p99"),
	}
}

func resourcePanels() []*timeseries.PanelBuilder {
	return []*timeseries.PanelBuilder{
		opsPanel("CPU", "Cores used per process.", unitCount,
			`sum by (instance) (rate(process_cpu_seconds_total{`+opsSel+`}[$__rate_interval]))`, "{{instance}}"),
		opsPanel("Memory", "Resident memory, the Go runtime's memory (what GpustoreMemoryNearLimit reads) and the limit (the container's, else the machine's).", unitBytes,
			`max by (instance) (process_resident_memory_bytes{`+opsSel+`})`, "{{instance}} resident",
			`max by (instance) (go_memstats_sys_bytes{`+opsSel+`} - go_memstats_heap_released_bytes{`+opsSel+`})`, "{{instance}} Go runtime",
			`max by (instance) (gpustore_process_memory_limit_bytes{`+opsSel+`})`, "{{instance}} limit"),
		opsPanel("Volume free space", "Share of each volume free (data: TSDBs and WAL; compact: the compactor's scratch).", unitPercentUnit,
			`min by (instance, volume) (gpustore_filesystem_available_bytes{`+opsSel+`} / gpustore_filesystem_size_bytes{`+opsSel+`})`, "{{instance}} {{volume}}").Max(1),
		opsPanel("Goroutines", "Goroutines per process.", unitCount,
			`max by (instance) (go_goroutines{`+opsSel+`})`, "{{instance}}"),
		opsPanel("Open files", "Open file descriptors per process, against the limit.", unitCount,
			`max by (instance) (process_open_fds{`+opsSel+`})`, "{{instance}} open",
			`max by (instance) (process_max_fds{`+opsSel+`})`, "{{instance}} limit"),
		opsPanel("Restarts", "Process starts in the last hour; GpustoreRestarting at 3.", unitCount,
			`max by (instance) (changes(process_start_time_seconds{`+opsSel+`}[1h]))`, "{{instance}}"),
	}
}
