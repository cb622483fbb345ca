package query

import (
	"context"
	"slices"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/util/annotations"
)

// Query-time deduplication is the fallback for data that still carries the
// replica labels of a Prometheus HA pair: the ingest HA tracker was off, or
// blocks came from elsewhere. Series that differ only in replica labels are
// merged into one series without those labels: the merged series follows
// one replica and switches to another only across a gap in the first, and
// for counter functions it refuses a switch that would look like a counter
// reset the replica it leaves did not see.

type dedupKey struct{}

// WithDedup marks ctx for deduplication by the given replica labels
// (none: off). The API middleware sets it from the `dedup` parameter.
func WithDedup(ctx context.Context, replicaLabels []string) context.Context {
	return context.WithValue(ctx, dedupKey{}, replicaLabels)
}

func dedupLabels(ctx context.Context) []string {
	l, _ := ctx.Value(dedupKey{}).([]string)
	return l
}

// counterFuncs are the PromQL functions whose input is a counter.
var counterFuncs = map[string]bool{"rate": true, "increase": true, "irate": true, "resets": true, "xrate": true, "xincrease": true}

// dedupSeriesSet reads every series of the underlying set, groups those that
// are equal but for the replica labels, and yields one merged series per
// group, sorted by the labels that remain.
func dedupSeriesSet(ss storage.SeriesSet, replicaLabels []string, hints *storage.SelectHints) storage.SeriesSet {
	var all []storage.Series
	replicated := false
	for ss.Next() {
		s := ss.At()
		all = append(all, s)
		if !replicated {
			for _, l := range replicaLabels {
				if s.Labels().Has(l) {
					replicated = true
					break
				}
			}
		}
	}
	if err := ss.Err(); err != nil {
		return storage.ErrSeriesSet(err)
	}
	if !replicated { // the common case: replicas were deduplicated at ingest
		return &listSeriesSet{series: all, idx: -1, warnings: ss.Warnings()}
	}
	groups := map[string]*dedupGroup{}
	var order []*dedupGroup
	b := labels.NewBuilder(labels.EmptyLabels())
	for _, s := range all {
		b.Reset(s.Labels())
		b.Del(replicaLabels...)
		ls := b.Labels()
		key := ls.String()
		g, ok := groups[key]
		if !ok {
			g = &dedupGroup{lset: ls}
			groups[key] = g
			order = append(order, g)
		}
		g.replicas = append(g.replicas, s)
	}
	slices.SortFunc(order, func(a, b *dedupGroup) int { return labels.Compare(a.lset, b.lset) })
	counter := hints != nil && counterFuncs[hints.Func]
	out := make([]storage.Series, 0, len(order))
	for _, g := range order {
		out = append(out, &dedupSeries{group: g, counter: counter})
	}
	return &listSeriesSet{series: out, idx: -1, warnings: ss.Warnings()}
}

type dedupGroup struct {
	lset     labels.Labels
	replicas []storage.Series
}

type dedupSeries struct {
	group   *dedupGroup
	counter bool
}

func (s *dedupSeries) Labels() labels.Labels { return s.group.lset }

func (s *dedupSeries) Iterator(chunkenc.Iterator) chunkenc.Iterator {
	if len(s.group.replicas) == 1 {
		return s.group.replicas[0].Iterator(nil)
	}
	it := &dedupIterator{counter: s.counter, last: minTime}
	for _, r := range s.group.replicas {
		it.its = append(it.its, &peekIterator{it: r.Iterator(nil)})
	}
	return it
}

const minTime = -1 << 62

// peekIterator remembers the sample it stands on.
type peekIterator struct {
	it   chunkenc.Iterator
	typ  chunkenc.ValueType // ValNone before the first sample and when done
	done bool
	t    int64
	v    float64
}

// advanceAfter moves to the first sample after t.
func (p *peekIterator) advanceAfter(t int64) {
	if p.done || (p.typ != chunkenc.ValNone && p.t > t) {
		return
	}
	p.typ = p.it.Seek(t + 1)
	if p.typ == chunkenc.ValNone {
		p.done = true
		return
	}
	p.t = p.it.AtT()
	if p.typ == chunkenc.ValFloat {
		_, p.v = p.it.At()
	}
}

// dedupIterator merges replicas of one series.
type dedupIterator struct {
	its      []*peekIterator
	cur      int
	counter  bool
	last     int64
	lastV    float64
	interval int64 // estimated scrape interval of the merged series
	typ      chunkenc.ValueType
	err      error
}

func (d *dedupIterator) Next() chunkenc.ValueType {
	for _, p := range d.its {
		p.advanceAfter(d.last)
		if err := p.it.Err(); err != nil {
			d.err = err
			return chunkenc.ValNone
		}
	}
	cur := d.its[d.cur]
	// Stay on the current replica unless it has a gap (nothing within twice
	// the interval) that another replica fills.
	pick := -1
	if cur.typ != chunkenc.ValNone && (d.interval == 0 || d.last == minTime || cur.t <= d.last+2*d.interval) {
		pick = d.cur
	} else {
		// Across the gap take the earliest sample of any replica, except, for
		// counters, one that is below the last value while the replica we are
		// on still goes up: that replica saw no reset, so it is a fake one.
		for {
			pick = -1
			for i, p := range d.its {
				if p.typ != chunkenc.ValNone && (pick == -1 || p.t < d.its[pick].t) {
					pick = i
				}
			}
			if pick == -1 || pick == d.cur || !d.counter || d.last == minTime {
				break
			}
			p := d.its[pick]
			if p.typ == chunkenc.ValFloat && p.v < d.lastV && cur.typ == chunkenc.ValFloat && cur.v >= d.lastV {
				p.advanceAfter(p.t)
				continue
			}
			break
		}
	}
	if pick == -1 {
		d.typ = chunkenc.ValNone
		return d.typ
	}
	p := d.its[pick]
	if d.last != minTime {
		if step := p.t - d.last; d.interval == 0 || (pick == d.cur && step < 4*d.interval) {
			d.interval = step
		}
	}
	d.cur, d.last, d.lastV, d.typ = pick, p.t, p.v, p.typ
	return d.typ
}

func (d *dedupIterator) Seek(t int64) chunkenc.ValueType {
	if d.typ != chunkenc.ValNone && d.last >= t {
		return d.typ
	}
	for {
		typ := d.Next()
		if typ == chunkenc.ValNone || d.last >= t {
			return typ
		}
	}
}

func (d *dedupIterator) At() (int64, float64) { return d.last, d.lastV }
func (d *dedupIterator) AtHistogram(h *histogram.Histogram) (int64, *histogram.Histogram) {
	return d.its[d.cur].it.AtHistogram(h)
}
func (d *dedupIterator) AtFloatHistogram(fh *histogram.FloatHistogram) (int64, *histogram.FloatHistogram) {
	return d.its[d.cur].it.AtFloatHistogram(fh)
}
func (d *dedupIterator) AtT() int64  { return d.last }
func (d *dedupIterator) AtST() int64 { return 0 }
func (d *dedupIterator) Err() error  { return d.err }

type listSeriesSet struct {
	series   []storage.Series
	idx      int
	warnings annotations.Annotations
}

func (l *listSeriesSet) Next() bool                        { l.idx++; return l.idx < len(l.series) }
func (l *listSeriesSet) At() storage.Series                { return l.series[l.idx] }
func (l *listSeriesSet) Err() error                        { return nil }
func (l *listSeriesSet) Warnings() annotations.Annotations { return l.warnings }
