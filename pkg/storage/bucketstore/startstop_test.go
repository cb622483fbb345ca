package bucketstore

import (
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// podEnergy is dcgm-exporter's energy counter with the Kubernetes mapping
// on: one series per pod on a GPU, each beginning where its job begins and
// ending (a staleness marker) where it ends, off the 15 s grid, its value
// the GPU's energy since boot (mJ, large beside what a job adds).
func podEnergy(host string, jobs [][2]int64) []rawData {
	var out []rawData
	for i, j := range jobs {
		s := rawData{lset: labels.FromStrings("__name__", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Hostname", host,
			"gpu", "0", "namespace", fmt.Sprintf("team-%d", i%2), "pod", fmt.Sprintf("job-%d", i))}
		for ts := j[0]; ts < j[1]; ts += 15_000 + int64(i*37)%200 - 100 {
			power := 300 + 250*math.Sin(float64(ts)/float64(17*minute))
			s.ts, s.fs = append(s.ts, ts), append(s.fs, math.Round(4e12+float64(ts-t0)*power))
		}
		s.ts, s.fs = append(s.ts, s.ts[len(s.ts)-1]+15_000), append(s.fs, math.Float64frombits(value.StaleNaN))
		out = append(out, s)
	}
	return out
}

// stepTimes is a training job's step-time histogram (a native histogram
// counter) from its start to its end.
func stepTimes(host string, from, to int64) rawData {
	s := rawData{lset: labels.FromStrings("__name__", "training_step_seconds", "Hostname", host, "job_name", "llm")}
	var buckets [3]int64
	for ts := from; ts < to; ts += 15_000 {
		for i := range buckets {
			buckets[i] += int64(ts/15_000%5) + int64(i)
		}
		count := uint64(buckets[0] + buckets[1] + buckets[2])
		s.ts = append(s.ts, ts)
		s.hs = append(s.hs, &histogram.Histogram{Schema: 0, Count: count, Sum: float64(count) / 3, ZeroThreshold: 0.001,
			PositiveSpans: []histogram.Span{{Offset: 0, Length: 3}}, PositiveBuckets: []int64{buckets[0], buckets[1] - buckets[0], buckets[2] - buckets[1]}})
	}
	return s
}

// startStopBucket holds jobs' series that start and stop inside the data,
// in 2h raw blocks, 5m blocks of each, and a 1h block of [0h, 12h).
func startStopBucket(t *testing.T, oldCounts bool) *dsBucket {
	d := newDSBucket(t)
	d.oldCounts = oldCounts
	jobs := [][2]int64{
		{t0 + 37*minute + 4_321, t0 + 5*hour + 12*minute + 777},
		{t0 + 2*hour + 2*minute + 13_000, t0 + 3*hour + 58*minute},
		{t0 + 6*hour + 30*minute + 1, t0 + 11*hour + 59*minute + 59_000},
		{t0 - hour, t0 + 9*hour + 3*minute},
	}
	data := append(podEnergy("node-001", jobs), gpuSeries("node-001", 1, t0-hour, t0+13*hour, 15_000)...)
	data = append(data, stepTimes("node-001", t0+3*hour+17*minute+3_001, t0+8*hour+41*minute))
	var raws, fives []block.Meta
	for h := int64(-2); h < 14; h += 2 {
		raws = append(raws, d.raw(nil, t0+h*hour, t0+(h+2)*hour, data))
	}
	for i := 0; i+1 < len(raws); i++ {
		fives = append(fives, d.downsample(downsample.Res5m, raws[i].MinTime, raws[i].MaxTime, nil, []block.Meta{raws[i]}, raws[i], raws[i+1]))
	}
	d.downsample(downsample.Res1h, t0, t0+12*hour, nil, fives[1:7], fives[1:7]...)
	return d
}

// startStopQueries are chargeback's and panels' counter queries over
// start/stop data, with the resolution they read and their step.
var startStopQueries = []struct {
	q    string
	res  int64
	step int64
}{
	{`sum by (namespace) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{pod!=""}[2h]))`, downsample.Res1h, 2 * hour},
	{`increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[3h])`, downsample.Res1h, hour},
	{`sum by (namespace) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{pod!=""}[1h]))`, downsample.Res5m, hour},
	{`rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])`, downsample.Res5m, 5 * minute},
	{`rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[30m])`, downsample.Res5m, 10 * minute},
	{`delta(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[2h])`, downsample.Res1h, hour},
	{`delta(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])`, downsample.Res1h, 2 * hour},
	{`increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10m])`, downsample.Res5m, 25 * minute},
}

// Jobs start and stop inside the ranges a chargeback panel evaluates
// (per-namespace energy per day, here per 2 hours), a pod's job in the
// middle of a 5m window. rate and increase over 5m and 1h data answer as
// over raw data, which extrapolates at most half an average interval past
// the first and last sample (not to the range's edges as the kept samples,
// farther apart, made it), or say they are approximate.
func TestCounterStartingInsideTheRangeAnswersAsRaw(t *testing.T) {
	d := startStopBucket(t, false)
	s := d.store()
	for _, c := range startStopQueries {
		start, end := t0+2*hour, t0+12*hour
		want := d.query(s, block.ResolutionRaw, c.q, start, end, c.step)
		got := d.query(s, c.res, c.q, start, end, c.step)
		if !got.hasInfo("served from downsampled blocks") {
			t.Fatalf("%s: not read from %s data: %q", c.q, resName(c.res), got.infos())
		}
		bad, n := diff(want, got, 1e-9, 5)
		if n == 0 {
			t.Fatalf("%s: raw answered nothing", c.q)
		}
		if len(bad) > 0 {
			t.Errorf("%s over %s data at a %s step: differs from raw (infos %q):\n%s",
				c.q, resName(c.res), fmtDur(c.step), got.infos(), strings.Join(bad, "\n"))
		}
		if got.hasInfo("approximate") {
			t.Errorf("%s over %s data at a %s step: said approximate: %q", c.q, resName(c.res), fmtDur(c.step), got.infos())
		}
	}
}

// Blocks downsampled before gpustore recorded how many raw samples a kept
// counter sample stands for, and native histograms (which never record
// it), cannot be answered as raw where a series starts or ends inside a
// range: there the answer says it is approximate, and where it says
// nothing it is raw's.
func TestCounterStartingInsideUnrecordedDataSaysApproximate(t *testing.T) {
	for _, c := range []struct {
		name      string
		oldCounts bool
		queries   []string
	}{
		{"blocks without counts", true, nil},
		{"native histograms", false, []string{
			"histogram_count(increase(training_step_seconds[2h]))",
			"histogram_count(rate(training_step_seconds[1h]))",
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := startStopBucket(t, c.oldCounts)
			s := d.store()
			queries := startStopQueries
			if c.queries != nil {
				queries = nil
				for _, q := range c.queries {
					queries = append(queries, struct {
						q    string
						res  int64
						step int64
					}{q, downsample.Res1h, hour}, struct {
						q    string
						res  int64
						step int64
					}{q, downsample.Res5m, 5 * minute})
				}
			}
			approximate := 0
			for _, q := range queries {
				start, end := t0+2*hour, t0+12*hour
				want := d.query(s, block.ResolutionRaw, q.q, start, end, q.step)
				got := d.query(s, q.res, q.q, start, end, q.step)
				bad, n := diff(want, got, 1e-9, 5)
				if n == 0 {
					t.Fatalf("%s: raw answered nothing", q.q)
				}
				if got.hasInfo("approximate") {
					approximate++
				} else if len(bad) > 0 {
					t.Errorf("%s over %s data at a %s step: differs from raw without saying so (infos %q):\n%s",
						q.q, resName(q.res), fmtDur(q.step), got.infos(), strings.Join(bad, "\n"))
				}
			}
			if approximate == 0 {
				t.Error("no answer said it was approximate: the series start inside the ranges")
			}
		})
	}
}
