package tenantdb

import "github.com/prometheus/client_golang/prometheus"

// collector exports per-tenant gauges read at scrape time.
type collector struct {
	m            *Manager
	headSeries   *prometheus.Desc
	blocks       *prometheus.Desc
	metaFamilies *prometheus.Desc
	headSpan     *prometheus.Desc
	topMetrics   *prometheus.Desc
	today        *prometheus.Desc
}

// topMetricsPerTenant is how many metric names per tenant
// gpustore_tsdb_head_top_metric_series shows: the offenders, at a bounded
// cost of the metric itself.
const topMetricsPerTenant = 10

// NewCollector returns a collector of gpustore_tsdb_* gauges per tenant.
func NewCollector(m *Manager) prometheus.Collector {
	return &collector{
		m:            m,
		headSeries:   prometheus.NewDesc("gpustore_tsdb_head_series", "Active series in the tenant's TSDB head.", []string{"tenant"}, nil),
		blocks:       prometheus.NewDesc("gpustore_tsdb_blocks", "Persisted blocks in the tenant's local TSDB.", []string{"tenant"}, nil),
		metaFamilies: prometheus.NewDesc("gpustore_tsdb_metadata_families", "Metric families with metadata for the tenant.", []string{"tenant"}, nil),
		headSpan: prometheus.NewDesc("gpustore_tsdb_head_span_seconds", "Time between the oldest and newest sample of the tenant's TSDB head; "+
			"the head cuts a block once it exceeds 1.5 block durations, so a larger value means blocks are waiting to be cut.", []string{"tenant"}, nil),
		topMetrics: prometheus.NewDesc("gpustore_tsdb_head_top_metric_series", "Series in the tenant's head of each of its 10 metric names with the most "+
			"(max_series_per_metric bounds them).", []string{"tenant", "metric"}, nil),
		today: prometheus.NewDesc("gpustore_tsdb_head_series_created_today", "Series the tenant's head created since the UTC day began "+
			"(or the process started; max_new_series_per_day bounds them).", []string{"tenant"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.headSeries
	ch <- c.blocks
	ch <- c.metaFamilies
	ch <- c.headSpan
	ch <- c.topMetrics
	ch <- c.today
}

func (c *collector) Collect(ch chan<- prometheus.Metric) {
	for _, t := range c.m.Tenants() {
		db := c.m.Existing(t)
		if db == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.headSeries, prometheus.GaugeValue, float64(db.Head().NumSeries()), t)
		ch <- prometheus.MustNewConstMetric(c.blocks, prometheus.GaugeValue, float64(len(db.Blocks())), t)
		ch <- prometheus.MustNewConstMetric(c.metaFamilies, prometheus.GaugeValue, float64(len(db.Metadata.Families())), t)
		span := 0.0
		if h := db.Head(); h.NumSeries() > 0 && h.MaxTime() >= h.MinTime() {
			span = float64(h.MaxTime()-h.MinTime()) / 1000
		}
		ch <- prometheus.MustNewConstMetric(c.headSpan, prometheus.GaugeValue, span, t)
		top, today := db.TopMetrics(topMetricsPerTenant)
		for _, m := range top {
			ch <- prometheus.MustNewConstMetric(c.topMetrics, prometheus.GaugeValue, float64(m.Series), t, m.Metric)
		}
		ch <- prometheus.MustNewConstMetric(c.today, prometheus.GaugeValue, float64(today), t)
	}
}
