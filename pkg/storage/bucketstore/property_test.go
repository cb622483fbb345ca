package bucketstore

import (
	"context"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// The random-query comparison of issues 29 and 38: raw against 5m and 1h
// answers through Prometheus' engine and the bucket store, for random
// steps, starts, offsets, ranges and functions, over counters with resets,
// a counter typed by metadata only, native histograms, MIG instances, and
// pods' series (a gauge and the energy counter) that start and end inside
// the data, read from the whole bucket or from the bucket after raw
// retention deleted the raw blocks before 4h (ranges across that edge read
// 5m or 1h data before it and raw data after). Each answer equals raw's
// (min, max, resets and counts exactly; sums, rate, increase and delta
// within rounding) or says it is approximate. GPUSTORE_PROPERTY_QUERIES
// (default 300) and GPUSTORE_PROPERTY_SEED (default 1; "random" draws one)
// change the run.

const propInterval = 15_000

// propertyData is the raw data of one host.
func propertyData(rng *rand.Rand, host string) []rawData {
	out := gpuSeries(host, 3, t0-2*hour, t0+14*hour, propInterval)
	for i := range out {
		// Not the sample at exactly the first block's start (the first
		// GPU's phase is 0): it belongs to the window before, of which no
		// block is downsampled, so it is gone once raw retention ends.
		if out[i].ts[0] == t0-2*hour {
			out[i].ts, out[i].fs = out[i].ts[1:], out[i].fs[1:]
		}
	}
	for g := range 3 {
		gpu := fmt.Sprint(g)
		// A pod's job on the GPU: series that begin and end inside the data,
		// off the 15 s grid, ending with a staleness marker.
		from := t0 + rng.Int64N(6*hour)
		to := from + hour + rng.Int64N(5*hour)
		pod := rawData{lset: labels.FromStrings("__name__", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "Hostname", host, "gpu", gpu, "pod", "train-"+gpu)}
		// The GPU's energy counter as the pod's series (dcgm-exporter's
		// Kubernetes mapping): mJ since boot, beginning and ending with the job.
		podEnergy := rawData{lset: labels.FromStrings("__name__", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Hostname", host, "gpu", gpu, "pod", "train-"+gpu)}
		viol := rawData{lset: labels.FromStrings("__name__", "DCGM_FI_DEV_POWER_VIOLATION", "Hostname", host, "gpu", gpu)}
		v, ns, mj := rng.Float64(), 0.0, 1e12*rng.Float64()
		for ts := t0 - 2*hour + rng.Int64N(propInterval); ts < t0+14*hour; ts += propInterval + rng.Int64N(200) - 100 {
			mj += (100 + 600*v) * propInterval
			if ts >= from && ts < to {
				v = math.Min(1, math.Max(0, v+rng.NormFloat64()*0.05))
				pod.ts, pod.fs = append(pod.ts, ts), append(pod.fs, v)
				podEnergy.ts, podEnergy.fs = append(podEnergy.ts, ts), append(podEnergy.fs, math.Round(mj))
			} else if ts >= to && len(pod.ts) > 0 && !value.IsStaleNaN(pod.fs[len(pod.fs)-1]) {
				pod.ts, pod.fs = append(pod.ts, ts), append(pod.fs, math.Float64frombits(value.StaleNaN))
				podEnergy.ts, podEnergy.fs = append(podEnergy.ts, ts), append(podEnergy.fs, math.Float64frombits(value.StaleNaN))
			}
		}
		// Scraped 1 ms after every 15 s: a sample 1 ms past each window's end.
		for ts := t0 - 2*hour + 1; ts < t0+14*hour; ts += propInterval {
			if rng.IntN(40) == 0 {
				ns += float64(rng.IntN(15_000_000_000)) // throttled for a while
			}
			viol.ts, viol.fs = append(viol.ts, ts), append(viol.fs, ns)
		}
		out = append(out, pod, podEnergy, viol)
	}
	// A native histogram counter: one training job's step times.
	h := rawData{lset: labels.FromStrings("__name__", "training_step_seconds", "Hostname", host, "job_name", "llm")}
	var buckets [4]int64
	var zero int64
	var sum float64
	for ts := t0 - 2*hour + 3_000; ts < t0+14*hour; ts += propInterval {
		if rng.IntN(900) == 0 { // the job restarted
			buckets, zero, sum = [4]int64{}, 0, 0
		}
		for i := range buckets {
			n := rng.Int64N(5)
			buckets[i] += n
			sum += float64(n) * math.Pow(2, float64(i))
		}
		zero += rng.Int64N(2)
		deltas := []int64{buckets[0], buckets[1] - buckets[0], buckets[2] - buckets[1], buckets[3] - buckets[2]}
		count := uint64(zero)
		for _, b := range buckets {
			count += uint64(b)
		}
		h.ts = append(h.ts, ts)
		h.hs = append(h.hs, &histogram.Histogram{Schema: 0, Count: count, Sum: sum, ZeroThreshold: 0.001, ZeroCount: uint64(zero),
			PositiveSpans: []histogram.Span{{Offset: 0, Length: 4}}, PositiveBuckets: deltas})
	}
	return append(out, h)
}

// propertyBucket: group a (receiver a) in 2h raw blocks, two of them
// compacted into a 4h block, each downsampled to 5m and the 5m blocks to
// 1h; group b (receiver b) in 2h raw blocks downsampled to 5m up to 8h
// only (the compactor has not got to the rest).
func propertyBucket(t *testing.T, seed uint64) (*dsBucket, map[string]*rawData) {
	rng := rand.New(rand.NewPCG(seed, seed^0x5eed))
	d := newDSBucket(t)
	d.types = func(family string) (model.MetricType, bool) {
		if family == "DCGM_FI_DEV_POWER_VIOLATION" {
			return model.MetricTypeCounter, true // remote write 2.0 metadata
		}
		return "", false
	}
	byLabels := map[string]*rawData{}
	for _, g := range []struct{ receiver, host string }{{"a", "node-a"}, {"b", "node-b"}} {
		ext := map[string]string{"receiver": g.receiver}
		data := propertyData(rng, g.host)
		for i := range data {
			byLabels[data[i].lset.String()] = &data[i]
		}
		var raws []block.Meta
		for h := int64(-2); h < 14; h += 2 {
			raws = append(raws, d.raw(ext, t0+h*hour, t0+(h+2)*hour, data))
		}
		if g.receiver == "a" {
			c := d.compact(raws[3], raws[4]) // [4h, 8h)
			raws = append(append(raws[:3:3], c), raws[5:]...)
		}
		var fives []block.Meta
		for i := 0; i+1 < len(raws); i++ {
			m := raws[i]
			if g.receiver == "b" && m.MinTime >= t0+8*hour {
				break
			}
			fives = append(fives, d.downsample(downsample.Res5m, m.MinTime, m.MaxTime, nil, []block.Meta{m}, m, raws[i+1]))
		}
		if g.receiver == "a" {
			var in []block.Meta
			for _, f := range fives {
				if f.MinTime >= t0 && f.MaxTime <= t0+12*hour {
					in = append(in, f)
				}
			}
			d.downsample(downsample.Res1h, t0, t0+12*hour, nil, in, in...)
		}
	}
	return d, byLabels
}

// A generated query and how its answer compares with raw's.
type propQuery struct {
	q          string
	res        int64
	start, end int64
	step       int64
	rng        int64 // the range of its range function (0: none)
	check      string
}

// Checks.
const (
	checkExact    = "exact"    // equal
	checkRounding = "rounding" // within 1e-9
	checkCounter  = "counter"  // rate/increase: within rounding
	checkPerSec   = "persec"   // the same, per second
)

func genQuery(rng *rand.Rand) propQuery {
	pick := func(xs ...int64) int64 { return xs[rng.IntN(len(xs))] }
	var p propQuery
	p.step = pick(minute, 5*minute, 7*minute, 25*minute, 27*minute, 30*minute, 30*minute, hour, hour, 73*minute,
		2*hour, 10_368_000 /* 2h52m48s: a 30-day panel's 250 points */, 3*hour, 5*hour, 6*hour, 6*hour)
	span := 2*hour + rng.Int64N(8*hour)
	p.start = t0 + 30*minute + rng.Int64N(11*hour-span)
	switch rng.IntN(4) {
	case 0: // a minute or two and a half off the step
		p.start += pick(60_000, 150_000, 17*60_000) - p.start%p.step
	case 1: // any millisecond
	default: // Grafana aligns start to the step
		p.start -= p.start % p.step
	}
	p.end = p.start + span
	p.res = pick(downsample.Auto, downsample.Auto, downsample.Res5m, downsample.Res1h)
	p.rng = pick(minute, 5*minute, 10*minute, 30*minute, hour, hour, 2*hour, 3*hour, p.step, p.step+propInterval /* $__rate_interval */)
	rs := model.Duration(time.Duration(p.rng) * time.Millisecond).String()
	off := ""
	if rng.IntN(3) == 0 {
		off = " offset " + model.Duration(time.Duration(pick(minute, 150_000, 5*minute, 17*minute, hour, hour))*time.Millisecond).String()
	}
	counters := []string{"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_POWER_VIOLATION"}
	gauges := []string{"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"}
	anyMetric := append(append([]string{}, counters...), gauges...)
	sel := func(ms []string) string {
		m := ms[rng.IntN(len(ms))]
		switch rng.IntN(8) {
		case 0, 1:
			return m + `{GPU_I_PROFILE!=""}` // the MIG instances
		case 2, 3:
			return m + `{pod!=""}` // the pods' series, which begin and end inside the data
		}
		return m
	}
	switch k := rng.IntN(15); k {
	case 0, 1:
		p.q, p.check = fmt.Sprintf("rate(%s[%s]%s)", sel(counters), rs, off), checkPerSec
	case 2:
		p.q, p.check = fmt.Sprintf("increase(%s[%s]%s)", sel(counters), rs, off), checkCounter
	case 14:
		p.q, p.check = fmt.Sprintf("delta(%s[%s]%s)", sel(counters), rs, off), checkCounter
	case 3:
		p.q, p.check = fmt.Sprintf("histogram_count(rate(training_step_seconds[%s]%s))", rs, off), checkPerSec
	case 4:
		p.q, p.check = fmt.Sprintf("resets(%s[%s]%s)", sel(counters), rs, off), checkExact
	case 5, 6:
		fn := []string{"min_over_time", "max_over_time"}[rng.IntN(2)]
		p.q, p.check = fmt.Sprintf("%s(%s[%s]%s)", fn, sel(anyMetric), rs, off), checkExact
	case 7:
		p.q, p.check = fmt.Sprintf("max by (Hostname) (max_over_time(%s[%s]%s))", sel(gauges), rs, off), checkExact
	case 8:
		p.q, p.check = fmt.Sprintf("sum_over_time(%s[%s]%s)", sel(anyMetric), rs, off), checkRounding
	case 9:
		p.q, p.check = fmt.Sprintf("count_over_time(%s[%s]%s)", sel(anyMetric), rs, off), checkExact
	case 10:
		p.q, p.check = fmt.Sprintf("avg_over_time(%s[%s]%s)", sel(anyMetric), rs, off), checkRounding
	case 11:
		p.q, p.check = fmt.Sprintf("changes(%s[%s]%s)", sel(anyMetric), rs, off), checkExact
	case 12:
		p.q, p.check = fmt.Sprintf("last_over_time(%s[%s]%s)", sel(counters), rs, off), checkExact
	default: // plain selectors, as panels draw them
		p.rng = 0
		p.q, p.check = []string{"avg by (Hostname) (%s%s)", "%s%s", "max(%s%s)"}[rng.IntN(3)], checkRounding
		p.q = fmt.Sprintf(p.q, sel(gauges), off)
	}
	return p
}

func envInt(name string, def uint64) uint64 {
	v := os.Getenv(name)
	if v == "random" {
		return rand.Uint64() % 1_000_000
	}
	if n, err := strconv.ParseUint(v, 10, 64); err == nil {
		return n
	}
	return def
}

func TestRandomQueriesMatchRawOrSayApproximate(t *testing.T) {
	seed := envInt("GPUSTORE_PROPERTY_SEED", 1)
	n := int(envInt("GPUSTORE_PROPERTY_QUERIES", 300))
	d, _ := propertyBucket(t, seed)
	s, retained := d.store(), afterRawRetention(t, d)
	rng := rand.New(rand.NewPCG(seed, 29))
	var downsampled, exact, approximate, exactAcross, exactStarting int
	for i := range n {
		p := genQuery(rng)
		d.localFrom = 0
		if rng.IntN(4) == 0 { // the receiver's local TSDB holds the last hours
			d.localFrom = t0 + 6*hour + rng.Int64N(5*hour)
		}
		from, store := "", s
		if rng.IntN(3) == 0 { // raw retention has ended at 4h
			from, store = " after raw retention", retained
			if rng.IntN(4) == 0 {
				p.res = block.ResolutionRaw // and is asked for: coarser data answers where it is gone
			}
		}
		want := d.query(s, block.ResolutionRaw, p.q, p.start, p.end, p.step)
		got := d.query(store, p.res, p.q, p.start, p.end, p.step)
		if len(want.points) == 0 {
			continue
		}
		crosses := from != "" && p.start-p.rng-hour < retentionEdge && p.end > retentionEdge // (offsets are at most 1h)
		ds := got.hasInfo("served from downsampled blocks")
		if ds {
			downsampled++
		}
		fail := func(format string, args ...any) {
			t.Helper()
			t.Errorf("seed %d query %d: %s under %s%s, %s step from %s to %s (local TSDB from %s): %s (infos %q)", seed, i, p.q, resName(p.res), from,
				fmtDur(p.step), fmtTime(p.start), fmtTime(p.end), fmtTime(d.localFrom), fmt.Sprintf(format, args...), got.infos())
		}
		if got.hasInfo("approximate answer") {
			approximate++
			// Approximate, and said so: still no series lost, unless the range
			// is shorter than a window and only downsampled data is left (one
			// a minute long meets a 5m window's point only where it ends; a
			// pod's series there may never be met).
			for k, w := range want.points {
				if len(w) >= 3 && len(got.points[k]) == 0 && (from == "" || p.rng == 0 || p.rng >= 5*minute) {
					fail("series %s missing", k)
				}
			}
			continue
		}
		if ds {
			exact++
			if crosses {
				exactAcross++
			}
			if p.check == checkCounter || p.check == checkPerSec {
				if slices.ContainsFunc(slices.Collect(maps.Keys(want.points)), func(k string) bool { return strings.Contains(k, `pod="train-`) }) {
					exactStarting++ // a pod's energy: it starts and ends inside the data
				}
			}
		}
		bad := comparePoints(p, want, got)
		if len(bad) > 0 {
			fail("differs from raw without saying it is approximate:\n%s", strings.Join(bad, "\n"))
		}
	}
	t.Logf("seed %d: %d queries, %d read downsampled data: %d exactly (%d across the raw retention edge, %d rates or increases of a series that starts inside), %d said approximate",
		seed, n, downsampled, exact, exactAcross, exactStarting, approximate)
	if exact < n/15 || approximate < n/20 || exactAcross < n/60 || exactStarting < n/150 {
		t.Errorf("seed %d: %d of %d queries answered exactly from downsampled data (%d across the retention edge, %d rates of series starting inside), %d approximately: the test exercises too little",
			seed, exact, n, exactAcross, exactStarting, approximate)
	}
}

// retentionEdge is where raw retention has ended in the property test's
// retained bucket: its raw blocks before are deleted.
const retentionEdge = t0 + 4*hour

// afterRawRetention returns a store over a copy of d's bucket without the
// raw blocks that end by retentionEdge, as the compactor's retention leaves
// it (their 5m and 1h blocks hold their hours).
func afterRawRetention(t *testing.T, d *dsBucket) *Store {
	t.Helper()
	ctx := context.Background()
	bkt := objstore.NewInMemBucket()
	err := d.bkt.Iter(ctx, "", func(name string) error {
		r, err := d.bkt.Get(ctx, name)
		if err != nil {
			return err
		}
		defer r.Close()
		return bkt.Upload(ctx, name, r)
	}, objstore.WithRecursiveIter())
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, m := range d.metas {
		if m.GPUStore.Downsample.Resolution == block.ResolutionRaw && m.MaxTime <= retentionEdge {
			if err := bkt.Delete(ctx, block.ObjectName(d.tenant, m.ULID, block.MetaFilename)); err != nil {
				t.Fatal(err)
			}
			n++
		}
	}
	if n == 0 {
		t.Fatal("no raw block before the retention edge")
	}
	return storeWith(t, bkt, nil, nil)
}

// comparePoints lists the points of got that differ from want beyond the
// query's check (at most 5).
func comparePoints(p propQuery, want, got answer) []string {
	rel := 0.0
	switch p.check {
	case checkRounding, checkCounter, checkPerSec:
		rel = 1e-9
	}
	bad, _ := diff(want, got, rel, 5)
	return bad
}
