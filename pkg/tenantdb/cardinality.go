package tenantdb

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunks"
)

// ErrMaxActiveSeries is returned (wrapped) by appends that would create a
// series beyond the tenant's limit.
var ErrMaxActiveSeries = errors.New("per-tenant active series limit reached")

// ErrMaxSeriesPerMetric is returned (wrapped) by appends that would create
// a series of a metric name that has max_series_per_metric in the head.
var ErrMaxSeriesPerMetric = errors.New("per-metric active series limit reached")

// ErrMaxNewSeriesPerDay is returned (wrapped) by appends that would create
// a series past the tenant's max_new_series_per_day.
var ErrMaxNewSeriesPerDay = errors.New("daily new series limit reached")

// seriesLimiter vetoes series creation past the tenant's limits; the TSDB
// calls it before it creates a series in the head, and tells it of every
// series created and deleted (head GC), so it knows the series of each
// metric name and those created today. Its work is per series created or
// deleted, never per sample.
type seriesLimiter struct {
	tenant string
	limits TenantLimits
	// head is the tenant's head once the database is open; nil while the
	// WAL is replayed (those series are not new, and are never refused).
	head func() *tsdb.Head
	now  func() time.Time

	mtx       sync.Mutex
	perMetric map[string]int // series in the head by metric name
	day       int64          // the UTC day (days since the epoch) createdToday counts
	today     int            // series created since the day began (or the process started)
}

func newSeriesLimiter(tenant string, l TenantLimits, head func() *tsdb.Head) *seriesLimiter {
	return &seriesLimiter{tenant: tenant, limits: l, head: head, now: time.Now, perMetric: map[string]int{}}
}

func (s *seriesLimiter) PreCreation(lset labels.Labels) error {
	h := s.head()
	if h == nil {
		return nil
	}
	if limit := s.limits.MaxActiveSeries(s.tenant); limit > 0 && h.NumSeries() >= uint64(limit) {
		return fmt.Errorf("%w (%d series) for tenant %q", ErrMaxActiveSeries, limit, s.tenant)
	}
	perMetric, perDay := s.limits.MaxSeriesPerMetric(s.tenant), s.limits.MaxNewSeriesPerDay(s.tenant)
	if perMetric <= 0 && perDay <= 0 {
		return nil
	}
	name := lset.Get(model.MetricNameLabel)
	s.mtx.Lock()
	defer s.mtx.Unlock()
	if perMetric > 0 && s.perMetric[name] >= perMetric {
		return fmt.Errorf("%w (%d series of %s) for tenant %q", ErrMaxSeriesPerMetric, perMetric, name, s.tenant)
	}
	if perDay > 0 && s.createdToday() >= perDay {
		return fmt.Errorf("%w (%d series created today, UTC) for tenant %q", ErrMaxNewSeriesPerDay, perDay, s.tenant)
	}
	return nil
}

// createdToday is today's count, reset when the UTC day changed; s.mtx held.
func (s *seriesLimiter) createdToday() int {
	if d := s.now().Unix() / 86400; d != s.day {
		s.day, s.today = d, 0
	}
	return s.today
}

func (s *seriesLimiter) PostCreation(lset labels.Labels) {
	replay := s.head() == nil
	s.mtx.Lock()
	s.perMetric[lset.Get(model.MetricNameLabel)]++
	if !replay {
		s.createdToday()
		s.today++
	}
	s.mtx.Unlock()
}

func (s *seriesLimiter) PostDeletion(deleted map[chunks.HeadSeriesRef]labels.Labels) {
	if len(deleted) == 0 {
		return
	}
	s.mtx.Lock()
	for _, lset := range deleted {
		name := lset.Get(model.MetricNameLabel)
		if s.perMetric[name]--; s.perMetric[name] <= 0 {
			delete(s.perMetric, name)
		}
	}
	s.mtx.Unlock()
}

// MetricSeries is a metric name and its series in the head.
type MetricSeries struct {
	Metric string
	Series int
}

// topMetrics returns the n metric names with the most series in the head,
// most first, and the series created today.
func (s *seriesLimiter) topMetrics(n int) ([]MetricSeries, int) {
	s.mtx.Lock()
	out := make([]MetricSeries, 0, len(s.perMetric))
	for m, c := range s.perMetric {
		out = append(out, MetricSeries{Metric: m, Series: c})
	}
	today := s.createdToday()
	s.mtx.Unlock()
	slices.SortFunc(out, func(a, b MetricSeries) int {
		return cmp.Or(cmp.Compare(b.Series, a.Series), cmp.Compare(a.Metric, b.Metric))
	})
	return out[:min(n, len(out))], today
}

// TopMetrics returns the n metric names with the most series in the
// tenant's head, most first, and the series the head created today (UTC;
// since the process started, if later).
func (db *DB) TopMetrics(n int) ([]MetricSeries, int) {
	if db.series == nil {
		return nil, 0
	}
	return db.series.topMetrics(n)
}
