package compact

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// metrics are the compactor's gpustore_compact_* and gpustore_downsample_*
// series.
type metrics struct {
	groups          *prometheus.GaugeVec
	compactions     *prometheus.CounterVec
	compactedBlocks *prometheus.CounterVec
	samples         *prometheus.CounterVec
	readBytes       *prometheus.CounterVec
	writtenBytes    *prometheus.CounterVec
	duration        prometheus.Histogram
	passDuration    prometheus.Histogram
	lastPassFailed  *prometheus.GaugeVec
	failures        *prometheus.CounterVec
	noCompactBlocks *prometheus.GaugeVec
	noCompactMarks  *prometheus.CounterVec
	deletionMarks   *prometheus.CounterVec
	deleted         *prometheus.CounterVec
	lastSuccess     *prometheus.GaugeVec
	leaseBusy       *prometheus.CounterVec
	indexBlocks     *prometheus.GaugeVec
	badFiles        *prometheus.GaugeVec

	downsampled        *prometheus.CounterVec
	downsampleSamples  *prometheus.CounterVec
	downsampleBytes    *prometheus.CounterVec
	downsampleDuration prometheus.Histogram
}

// newMetrics registers the metrics with reg (nil: none).
func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	t := []string{"tenant"}
	return &metrics{
		groups: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_compact_groups", Help: "Compaction groups (resolution + external labels) of the tenant at the last pass.",
		}, t),
		compactions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_compact_compactions_total", Help: "Compactions done: each turns several blocks into one.",
		}, t),
		compactedBlocks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_compact_blocks_compacted_total", Help: "Source blocks compacted into larger ones (then marked for deletion).",
		}, t),
		samples: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_compact_samples_total", Help: "Samples written into compacted blocks.",
		}, t),
		readBytes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_compact_read_bytes_total", Help: "Bytes of source blocks downloaded for compaction.",
		}, t),
		writtenBytes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_compact_written_bytes_total", Help: "Bytes of compacted blocks uploaded.",
		}, t),
		duration: f.NewHistogram(prometheus.HistogramOpts{
			Name: "gpustore_compact_duration_seconds", Help: "Time of one compaction: download, compact, upload, mark.",
			Buckets: prometheus.ExponentialBuckets(0.1, 3, 10),
		}),
		passDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name: "gpustore_compact_pass_duration_seconds", Help: "Time of one tenant's pass.",
			Buckets: prometheus.ExponentialBuckets(0.1, 3, 10),
		}),
		lastPassFailed: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_compact_last_pass_failed", Help: "1 when the tenant's last pass stopped on an error (retried next pass).",
		}, t),
		failures: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_compact_pass_failures_total", Help: "Tenant passes that stopped on an error.",
		}, t),
		noCompactBlocks: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_compact_no_compact_blocks", Help: "Blocks of the tenant with a no-compact mark (unreadable; left for queries).",
		}, t),
		noCompactMarks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_compact_no_compact_marks_total", Help: "No-compact marks written, by reason.",
		}, []string{"tenant", "reason"}),
		deletionMarks: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_compact_deletion_marks_total", Help: "Deletion marks written, by reason (compacted, replaced, retention).",
		}, []string{"tenant", "reason"}),
		deleted: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_compact_deleted_blocks_total", Help: "Block directories deleted from the bucket (marked: after the delete delay; partial: crashed uploads).",
		}, []string{"tenant", "reason"}),
		lastSuccess: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_compact_last_success_timestamp_seconds", Help: "When the tenant's last pass finished without error.",
		}, t),
		leaseBusy: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_compact_lease_busy_total", Help: "Passes skipped because another compactor held the tenant's lease.",
		}, t),
		indexBlocks: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_compact_bucket_index_blocks", Help: "Blocks listed in the tenant's bucket index at its last write (marked ones included).",
		}, t),
		badFiles: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "gpustore_compact_unparsable_files", Help: "Blocks whose meta.json (left alone) or deletion-mark.json (treated as absent) did not parse at the tenant's last pass: torn or empty files.",
		}, []string{"tenant", "file"}),
		downsampled: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_downsample_blocks_total", Help: "Downsampled blocks written, by resolution.",
		}, []string{"tenant", "resolution"}),
		downsampleSamples: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_downsample_samples_total", Help: "Samples read from the source blocks (direction=read) and written to downsampled blocks (direction=written).",
		}, []string{"tenant", "direction"}),
		downsampleBytes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "gpustore_downsample_written_bytes_total", Help: "Bytes of downsampled blocks uploaded, by resolution.",
		}, []string{"tenant", "resolution"}),
		downsampleDuration: f.NewHistogram(prometheus.HistogramOpts{
			Name: "gpustore_downsample_duration_seconds", Help: "Time of one downsampling: download, downsample, upload.",
			Buckets: prometheus.ExponentialBuckets(0.1, 3, 10),
		}),
	}
}
