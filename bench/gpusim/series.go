package gpusim

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	promvalue "github.com/prometheus/prometheus/model/value"
)

// Label is one label pair.
type Label struct{ Name, Value string }

// Series is one sample of one series, ready to encode. Labels are sorted by
// name, include "__name__", and are shared with the simulator: treat them as
// read-only. They stay valid after later steps (a churned series gets a new
// slice; the old one is never modified).
type Series struct {
	Labels []Label
	Desc   *MetricDesc // family; histogram _bucket/_sum/_count point to the histogram
	T      int64       // milliseconds since the Unix epoch
	V      float64
}

// Name returns the value of __name__.
func (s *Series) Name() string { return s.Get("__name__") }

// Get returns the value of label name, or "".
func (s *Series) Get(name string) string {
	for _, l := range s.Labels {
		if l.Name == name {
			return l.Value
		}
	}
	return ""
}

// String renders the series in PromQL selector form (tests, logs).
func (s *Series) String() string {
	b := []byte(s.Name())
	b = appendLabelsText(b, s.Labels)
	return fmt.Sprintf("%s %g @%d", b, s.V, s.T)
}

// Replica is one member of a simulated Prometheus HA pair.
type Replica struct {
	// Name is the __replica__ external label ("p0", "p1"); it seeds the jitter.
	Name string
	// Offset is added to sample timestamps: a second replica scrapes a little
	// later than the first.
	Offset time.Duration
	// Jitter is the relative jitter applied to continuous gauges (0.001 =
	// ±0.1%). Counters, codes and integer readings are never jittered, so
	// both replicas see the same monotonic counters.
	Jitter float64
}

// slot is one series of a seriesSet: its labels and, lazily, its text-format
// prefix `name{a="b",...} `.
type slot struct {
	labels []Label
	id     uint64
	text   []byte
}

type famSeries struct {
	slots []slot
	vals  []float64
}

// seriesSet holds the series of one node (or of the cluster scope), grouped
// by family so a text page lists each family contiguously. Labels are built
// only when the set's key (its job, its down state) changes; a step
// otherwise only rewrites vals in place.
type seriesSet struct {
	fams  [numFamilies]famSeries
	key   uint64
	valid bool
	// prev holds the slots before a rebuild; stale those of them the
	// rebuild dropped (until the next step): AppendStaleMarkers' series.
	prev, stale []staleSlot
}

type staleSlot struct {
	slot
	fam int
}

func (s *seriesSet) count() int {
	n := 0
	for i := range s.fams {
		n += len(s.fams[i].vals)
	}
	return n
}

// emitter walks the model in a fixed order. In build mode it creates slots
// with labels; otherwise it writes values into existing slots by position, so
// the steady state allocates nothing.
type emitter struct {
	set     *seriesSet
	build   bool
	cur     [numFamilies]int32
	base    []Label
	scratch []Label
	target  bool   // add job/instance (Config.TargetLabels)
	job     string // current target's job label
	inst    string // current target's instance label
}

func (e *emitter) begin(set *seriesSet, key uint64) {
	e.set = set
	e.build = !set.valid || set.key != key
	set.stale = set.stale[:0]
	if e.build {
		set.prev = set.prev[:0]
		for f := range set.fams {
			for _, sl := range set.fams[f].slots {
				set.prev = append(set.prev, staleSlot{slot: sl, fam: f})
			}
			set.fams[f].slots = set.fams[f].slots[:0]
			set.fams[f].vals = set.fams[f].vals[:0]
		}
		set.key, set.valid = key, true
	}
	e.cur = [numFamilies]int32{}
	e.base = e.base[:0]
}

// end checks that a fill pass visited exactly the slots the build pass made:
// a mismatch is a bug in the walk (order depending on something not in key).
// After a build pass it notes the series the rebuild dropped.
func (e *emitter) end() {
	if e.build {
		e.noteStale()
		return
	}
	for f := range e.set.fams {
		if int(e.cur[f]) != len(e.set.fams[f].vals) {
			panic(fmt.Sprintf("gpusim: %s: fill pass wrote %d series, build pass made %d", Catalogue[f].Name, e.cur[f], len(e.set.fams[f].vals)))
		}
	}
}

func (e *emitter) setTarget(job, inst string) { e.job, e.inst = job, inst }

func (e *emitter) add(f int, v float64, extra ...Label) { e.addNamed(f, "", v, extra...) }

// addNamed adds a series of family f named name (histogram parts), or of
// the family's name when name is "".
func (e *emitter) addNamed(f int, name string, v float64, extra ...Label) {
	fs := &e.set.fams[f]
	if !e.build {
		fs.vals[e.cur[f]] = v
		e.cur[f]++
		return
	}
	if name == "" {
		name = Catalogue[f].Name
	}
	sc := e.scratch[:0]
	sc = append(sc, Label{"__name__", name})
	sc = append(sc, e.base...)
	sc = append(sc, extra...)
	if e.target {
		sc = append(sc, Label{"job", e.job}, Label{"instance", e.inst})
	}
	slices.SortFunc(sc, func(a, b Label) int { return strings.Compare(a.Name, b.Name) })
	e.scratch = sc
	ls := make([]Label, len(sc))
	copy(ls, sc)
	id := uint64(14695981039346656037)
	for _, l := range ls {
		id = h3(id, strHash(l.Name), strHash(l.Value))
	}
	fs.slots = append(fs.slots, slot{labels: ls, id: id})
	fs.vals = append(fs.vals, v)
	e.cur[f]++
}

// noteStale records the series of the set before its rebuild that it no
// longer has (a job's pod labels, a GPU gone, a node down).
func (e *emitter) noteStale() {
	set := e.set
	if len(set.prev) == 0 {
		return
	}
	kept := make(map[uint64]bool, set.count())
	for f := range set.fams {
		for _, sl := range set.fams[f].slots {
			kept[sl.id] = true
		}
	}
	for _, p := range set.prev {
		if !kept[p.id] {
			set.stale = append(set.stale, p)
		}
	}
}

// staleNaN is Prometheus' staleness marker (model/value.StaleNaN).
var staleNaN = math.Float64frombits(promvalue.StaleNaN)

// AppendStaleMarkers appends a staleness marker (Prometheus' StaleNaN) at
// t for each series that the last step dropped: what a scraping Prometheus
// writes, and remote-writes, when a series is gone from a target's page or
// the target is down. Call it after AppendSamples(t): a receiver's queries
// then stop seeing a vanished series at once instead of for their lookback
// delta.
func (c *Cluster) AppendStaleMarkers(buf []Series, t time.Time, r Replica) []Series {
	ts := t.Add(r.Offset).UnixMilli()
	for _, n := range c.nodes {
		buf = appendStale(buf, &n.set, ts)
	}
	return appendStale(buf, &c.cset, ts)
}

func appendStale(buf []Series, set *seriesSet, ts int64) []Series {
	for _, p := range set.stale {
		buf = append(buf, Series{Labels: p.labels, Desc: &Catalogue[p.fam], T: ts, V: staleNaN})
	}
	return buf
}
