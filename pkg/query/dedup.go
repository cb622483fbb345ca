package query

import (
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
// merged into one series without those labels that covers the union of the
// replicas' time ranges: it starts on the replica with the earliest sample,
// follows it, and switches to another only across a gap in the first; for
// counter functions it refuses a switch that would look like a counter reset
// the replica it leaves did not see.
//
// Each replica series is the merge of the head, local blocks and bucket
// blocks (openQuerier) before it gets here, so block boundaries are
// invisible to the rule. Which labels name the replicas, if any, is the
// read's option (readopts.ReadOptions.ReplicaLabels): the API sets them
// unless the request asks dedup=false, rules always.

// counterFuncs are the PromQL functions whose input is a counter.
var counterFuncs = map[string]bool{"rate": true, "increase": true, "irate": true, "resets": true, "xrate": true, "xincrease": true}

// dedupSeriesSet reads every series of the underlying set, groups those that
// are equal but for the replica labels, and yields one merged series per
// group, sorted by the labels that remain. Without replicas it yields the
// set's series in the set's order.
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
	for _, g := range order { // replicas in label order, whatever the select's: the merge prefers the first on a tie
		if len(g.replicas) > 1 {
			slices.SortFunc(g.replicas, func(a, b storage.Series) int { return labels.Compare(a.Labels(), b.Labels()) })
		}
	}
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
		it.its = append(it.its, &replicaIterator{it: r.Iterator(nil), prevT: minTime, steps: firstSteps(r)})
	}
	return it
}

const minTime = -1 << 62

// firstSteps reads a replica's first three samples with an iterator of its
// own: the merge must judge the first step of a replica (a gap or not)
// before it has seen two.
func firstSteps(s storage.Series) (steps [2]int64) {
	it := s.Iterator(nil)
	var prev int64
	for i := 0; i < 3 && it.Next() != chunkenc.ValNone; i++ {
		t := it.AtT()
		if i > 0 {
			steps[i-1] = t - prev
		}
		prev = t
	}
	return steps
}

// replicaIterator walks one replica sample by sample, remembers the sample
// it stands on and learns the replica's scrape interval from its own steps,
// including those of samples the merge does not take.
type replicaIterator struct {
	it    chunkenc.Iterator
	typ   chunkenc.ValueType // ValNone before the first sample and when done
	done  bool
	t     int64
	v     float64
	prevT int64    // the replica's sample before t (minTime: none)
	steps [2]int64 // its last two steps up to prevT (0: unknown)
}

// next moves to the replica's next sample.
func (r *replicaIterator) next() {
	if r.done {
		return
	}
	if r.typ != chunkenc.ValNone {
		if r.prevT != minTime {
			r.steps = [2]int64{r.steps[1], r.t - r.prevT}
		}
		r.prevT = r.t
	}
	r.typ = r.it.Next()
	if r.typ == chunkenc.ValNone {
		r.done = true
		return
	}
	r.t = r.it.AtT()
	if r.typ == chunkenc.ValFloat {
		_, r.v = r.it.At()
	}
}

// advanceTo moves to the replica's first sample at or after t.
func (r *replicaIterator) advanceTo(t int64) {
	for !r.done && (r.typ == chunkenc.ValNone || r.t < t) {
		r.next()
	}
}

// interval is the replica's scrape interval: the shorter of its last two
// steps, so that one missed scrape does not double it (0: unknown).
func (r *replicaIterator) interval() int64 {
	a, b := r.steps[0], r.steps[1]
	switch {
	case a == 0:
		return b
	case b == 0:
		return a
	}
	return min(a, b)
}

// dedupIterator merges replicas of one series.
type dedupIterator struct {
	its     []*replicaIterator
	cur     int // the replica of the last sample
	counter bool
	last    int64
	lastV   float64
	typ     chunkenc.ValueType
	err     error
}

func (d *dedupIterator) Next() chunkenc.ValueType {
	if d.err != nil {
		return chunkenc.ValNone
	}
	for _, r := range d.its {
		r.advanceTo(d.last + 1)
	}
	pick := d.pick()
	for _, r := range d.its {
		if err := r.it.Err(); err != nil {
			d.err = err
			return chunkenc.ValNone
		}
	}
	if pick == -1 {
		d.typ = chunkenc.ValNone
		return d.typ
	}
	r := d.its[pick]
	d.cur, d.last, d.lastV, d.typ = pick, r.t, r.v, r.typ
	return d.typ
}

// pick chooses the replica of the next sample; every replica stands on its
// first sample after the last one.
func (d *dedupIterator) pick() int {
	if d.last == minTime { // the first sample: whichever replica has the earliest
		return d.earliest()
	}
	cur := d.its[d.cur]
	interval := cur.interval()
	// Stay on the current replica unless it has a gap: nothing within twice
	// its interval.
	if cur.typ != chunkenc.ValNone && (interval == 0 || cur.t <= d.last+2*interval) {
		return d.cur
	}
	// Across the gap take the earliest sample of any replica, but none within
	// half an interval of the last one: that is the other replica's answer to
	// the scrape just taken.
	for i, r := range d.its {
		if i != d.cur {
			r.advanceTo(d.last + max(1, interval/2))
		}
	}
	for {
		pick := d.earliest()
		if pick == -1 || pick == d.cur || !d.counter {
			return pick
		}
		// For counters, not a sample below the last value while the replica
		// we are on still goes up: that replica saw no reset, so it is a fake one.
		r := d.its[pick]
		if r.typ == chunkenc.ValFloat && r.v < d.lastV && cur.typ == chunkenc.ValFloat && cur.v >= d.lastV {
			r.next()
			continue
		}
		return pick
	}
}

// earliest is the replica standing on the earliest sample (-1: all done).
func (d *dedupIterator) earliest() int {
	pick := -1
	for i, r := range d.its {
		if r.typ != chunkenc.ValNone && (pick == -1 || r.t < d.its[pick].t) {
			pick = i
		}
	}
	return pick
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
