package bucketstore

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

const t0 = int64(1_767_225_600_000) // 2026-01-01T00:00:00Z

// gridBucket is 12 hours of a GPU node in 2-hour raw blocks, each
// downsampled to 5m, and the 12 hours at 1h, as the compactor leaves them
// while raw data is kept.
func gridBucket(t *testing.T) *dsBucket {
	d := newDSBucket(t)
	data := gpuSeries("node-001", 4, t0-hour, t0+13*hour, 15_000)
	var raws, fives []block.Meta
	for h := int64(-1); h < 13; h += 2 {
		raws = append(raws, d.raw(nil, t0+h*hour, t0+(h+2)*hour, data))
	}
	for i := 1; i+1 < len(raws); i++ {
		m := raws[i]
		fives = append(fives, d.downsample(downsample.Res5m, m.MinTime, m.MaxTime, nil, []block.Meta{m}, m, raws[i+1]))
	}
	d.downsample(downsample.Res1h, fives[0].MinTime, fives[len(fives)-1].MaxTime, nil, fives, fives...)
	return d
}

// Range functions evaluated off the downsampled windows' grid (a step that
// is not a multiple of the resolution, an unaligned start, an offset) must
// not read windows that straddle their ranges: under auto the answer equals
// raw's (rate and increase within 1e-6 where the series covers the range,
// min/max exactly), or says it is approximate.
func TestRangeFunctionsOffTheWindowGrid(t *testing.T) {
	d := gridBucket(t)
	s := d.store()
	for _, c := range []struct {
		q           string
		start, step int64
		rel         float64
	}{
		{"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])", t0 + 3*hour, 27 * minute, 1e-6},
		{"increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[10m])", t0 + 3*hour + 150_000, 30 * minute, 1e-6},
		{"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m] offset 150s)", t0 + 3*hour, 30 * minute, 1e-6},
		{"max_over_time(DCGM_FI_DEV_GPU_TEMP[5m])", t0 + 3*hour + 60_000, 35 * minute, 0},
		{"min_over_time(DCGM_FI_DEV_GPU_TEMP[1h])", t0 + 5*hour + 7*minute, 6 * hour, 0},
		{"sum_over_time(DCGM_FI_DEV_GPU_TEMP[5m] offset 1m)", t0 + 3*hour, 30 * minute, 1e-9},
	} {
		end := t0 + 11*hour
		want := d.query(s, block.ResolutionRaw, c.q, c.start, end, c.step)
		got := d.query(s, downsample.Auto, c.q, c.start, end, c.step)
		bad, n := diff(want, got, c.rel, 5)
		if n == 0 {
			t.Fatalf("%s: raw answered nothing", c.q)
		}
		if len(bad) > 0 && !got.hasInfo("approximate") {
			t.Errorf("%s at a %s step from %s: differs from raw without saying it is approximate (infos %q):\n%s",
				c.q, fmtDur(c.step), fmtTime(c.start), got.infos(), strings.Join(bad, "\n"))
		}
		if !got.hasInfo("served from downsampled blocks") {
			t.Errorf("%s at a %s step from %s: read raw; the windows fit once moved (infos %q)", c.q, fmtDur(c.step), fmtTime(c.start), got.infos())
		}
		// Each step read at 5m or 1h is raw's answer at the last window end
		// at or before it (less the offset), moved to it.
		if got.hasInfo("evaluated at the last window end") {
			checkShifted(t, d, s, c.q, c.start, end, c.step, c.rel, got)
		}
	}
}

// checkShifted requires each point of got to equal raw's at its own time
// or at the last 5m or 1h window end before it (the offset taken off).
func checkShifted(t *testing.T, d *dsBucket, s *Store, q string, start, end, step int64, rel float64, got answer) {
	t.Helper()
	off := int64(0)
	if i := strings.Index(q, " offset "); i >= 0 {
		dur, err := model.ParseDuration(strings.TrimRight(q[i+len(" offset "):], ")"))
		if err != nil {
			t.Fatal(err)
		}
		off = time.Duration(dur).Milliseconds()
	}
	atWindowEnds := 0
	for at := start; at <= end; at += step {
		var wants []answer
		for _, res := range []int64{0, downsample.Res5m, downsample.Res1h} {
			e := at
			if res > 0 {
				e -= ((at-off)%res + res) % res
			}
			wants = append(wants, d.query(s, block.ResolutionRaw, q, e, e, 0))
		}
		for k, g := range got.points {
			v, ok := g[at]
			if !ok {
				continue
			}
			match := -1
			for i, w := range wants {
				if wv, ok := w.points[k]; ok && closeTo(wv[lastKey(wv)], v, rel) {
					match = i
					break
				}
			}
			switch match {
			case -1:
				t.Errorf("%s at %s: %s is %v, raw's neither there nor at the last window end before", q, fmtTime(at), k, v)
			case 1, 2:
				atWindowEnds++
			}
		}
	}
	if atWindowEnds == 0 {
		t.Errorf("%s: no step was moved", q)
	}
}

func lastKey(m map[int64]float64) int64 {
	var k int64
	for t := range m {
		k = t
	}
	return k
}

func fmtDur(ms int64) string { return (time.Duration(ms) * time.Millisecond).String() }
