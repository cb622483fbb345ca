package tenantdb

import "github.com/prometheus/client_golang/prometheus"

// collector exports per-tenant gauges read at scrape time.
type collector struct {
	m            *Manager
	headSeries   *prometheus.Desc
	blocks       *prometheus.Desc
	metaFamilies *prometheus.Desc
}

// NewCollector returns a collector of gpustore_tsdb_* gauges per tenant.
func NewCollector(m *Manager) prometheus.Collector {
	return &collector{
		m:            m,
		headSeries:   prometheus.NewDesc("gpustore_tsdb_head_series", "Active series in the tenant's TSDB head.", []string{"tenant"}, nil),
		blocks:       prometheus.NewDesc("gpustore_tsdb_blocks", "Persisted blocks in the tenant's local TSDB.", []string{"tenant"}, nil),
		metaFamilies: prometheus.NewDesc("gpustore_tsdb_metadata_families", "Metric families with metadata for the tenant.", []string{"tenant"}, nil),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.headSeries
	ch <- c.blocks
	ch <- c.metaFamilies
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
	}
}
