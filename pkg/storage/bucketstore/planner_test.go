package bucketstore

import (
	"strings"
	"testing"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// checkLikeRaw runs each query under res and under raw and requires the
// same answer (within rel) without an approximation said.
func checkLikeRaw(t *testing.T, d *dsBucket, s *Store, res int64, qs []string, start, end, step int64, rel float64) {
	t.Helper()
	for _, q := range qs {
		want := d.query(s, block.ResolutionRaw, q, start, end, step)
		got := d.query(s, res, q, start, end, step)
		bad, n := diff(want, got, rel, 5)
		if n == 0 {
			t.Fatalf("%s: raw answered nothing", q)
		}
		if len(bad) > 0 {
			t.Errorf("%s under %s: %d points differ from raw (infos %q):\n%s", q, resName(res), len(bad), got.infos(), strings.Join(bad, "\n"))
		}
		if got.hasInfo("approximate") {
			t.Errorf("%s under %s: said approximate, an exact answer was due: %q", q, resName(res), got.infos())
		}
	}
}

// A block marked no-compact (it failed to read once) is never an input of
// compaction or downsampling. Its neighbours compacted into a block that
// spans its hours, and that block downsampled, auto must still read the
// no-compact block's raw data for those hours: coverage is judged per block
// (a downsampled block holds its sources' and parents' samples), never by
// time alone.
func TestNoCompactBlockBesideItsCompactedNeighbours(t *testing.T) {
	d := newDSBucket(t)
	data := gpuSeries("node-001", 2, t0, t0+8*hour, 15_000)
	// Jobs whose energy series begin and end inside the no-compact block's
	// hours and beside them: rate and increase over ranges across them
	// count the no-compact block's raw samples with the 5m data's.
	data = append(data, podEnergy("node-001", [][2]int64{
		// Half a minute into a range from 1h30m: raw data takes the series to
		// start inside it, the 5m data alone (without the no-compact block's
		// samples in the middle) would not.
		{t0 + hour + 30*minute + 31_017, t0 + 5*hour + 3*minute},
		{t0 + 2*hour + 31*minute + 7, t0 + 3*hour + 44*minute},
		{t0 + hour + 7*minute, t0 + 5*hour + 3*minute},
	})...)
	b1 := d.raw(nil, t0, t0+2*hour, data)
	x := d.raw(nil, t0+2*hour, t0+4*hour, data)
	b3 := d.raw(nil, t0+4*hour, t0+6*hour, data)
	b4 := d.raw(nil, t0+6*hour, t0+8*hour, data)
	d.noCompact(x)
	c := d.compact(b1, b3)
	d.downsample(downsample.Res5m, t0, t0+6*hour, nil, []block.Meta{c}, c, b4)
	s := d.store()
	if got := blockIDs(s, d.tenant); len(got) != 4 {
		t.Fatalf("visible blocks %v: want the compacted block, its 5m block, the no-compact block and the last", got)
	}
	checkLikeRaw(t, d, s, downsample.Auto, []string{
		"max_over_time(DCGM_FI_DEV_GPU_TEMP[30m])",
		"count_over_time(DCGM_FI_DEV_GPU_TEMP[30m])",
		"increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[30m])",
		"increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[2h])",
		"increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[3h])",
		"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])",
	}, t0+hour, t0+6*hour, 30*minute, 1e-9)
	// One step (a query frontend's piece, a dashboard's stat panel): no
	// other step's range puts the samples back for it.
	checkLikeRaw(t, d, s, downsample.Auto, []string{"increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[3h])"},
		t0+4*hour+30*minute, t0+4*hour+30*minute, 30*minute, 1e-9)
}

// Two groups (receivers with their own external labels): one's hours
// downsampled, the other's not (not yet, or never: a receiver that
// stopped). Auto reads each group at the resolution its own blocks cover:
// the second group's series are not hidden by the first's 5m blocks.
func TestGroupsJudgedApart(t *testing.T) {
	d := newDSBucket(t)
	a, b := map[string]string{"receiver": "a"}, map[string]string{"receiver": "b"}
	dataA := gpuSeries("node-a", 2, t0, t0+8*hour, 15_000)
	dataB := gpuSeries("node-b", 2, t0, t0+6*hour, 15_000) // stopped at 6h
	var raws []block.Meta
	for h := int64(0); h < 8; h += 2 {
		raws = append(raws, d.raw(a, t0+h*hour, t0+(h+2)*hour, dataA))
		if h < 6 {
			d.raw(b, t0+h*hour, t0+(h+2)*hour, dataB)
		}
	}
	for i := 0; i+1 < len(raws); i++ {
		d.downsample(downsample.Res5m, raws[i].MinTime, raws[i].MaxTime, nil, []block.Meta{raws[i]}, raws[i], raws[i+1])
	}
	s := d.store()
	checkLikeRaw(t, d, s, downsample.Auto, []string{
		"max by (Hostname) (max_over_time(DCGM_FI_DEV_GPU_TEMP[30m]))",
		"sum by (Hostname) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h]))",
	}, t0+hour, t0+6*hour, time30m, 1e-6)
	// The first group's data is still read downsampled.
	if got := d.query(s, downsample.Auto, "max_over_time(DCGM_FI_DEV_GPU_TEMP[30m])", t0+hour, t0+6*hour, time30m); !got.hasInfo("5m data for") {
		t.Errorf("group a's hours not read at 5m: %q", got.infos())
	}

	// A third receiver stopped long ago: raw retention deleted its raw
	// blocks, its 5m blocks remain. A query that reads raw (a short step)
	// reads the other groups raw and this one at 5m, rather than nothing.
	c := map[string]string{"receiver": "c"}
	dataC := gpuSeries("node-c", 2, t0, t0+6*hour, 15_000)
	var rawC []block.Meta
	for h := int64(0); h < 6; h += 2 {
		rawC = append(rawC, d.raw(c, t0+h*hour, t0+(h+2)*hour, dataC))
	}
	for i := 0; i+1 < len(rawC); i++ {
		d.downsample(downsample.Res5m, rawC[i].MinTime, rawC[i].MaxTime, nil, []block.Meta{rawC[i]}, rawC[i], rawC[i+1])
	}
	for _, m := range rawC {
		d.delete(m)
	}
	s = d.store()
	got := d.query(s, downsample.Auto, `count by (Hostname) (max_over_time(DCGM_FI_DEV_GPU_TEMP[5m]))`, t0+hour, t0+3*hour, 5*minute)
	for _, host := range []string{"node-a", "node-b", "node-c"} {
		k := `{Hostname="` + host + `"}`
		if n := len(got.points[k]); n != 25 {
			t.Errorf("%s: %d steps of 25 have its series (infos %q)", host, n, got.infos())
		}
		for ts, v := range got.points[k] {
			if v != 4 { // two GPUs, the first with two MIG instances
				t.Errorf("%s at %s: %v series, want 4", host, fmtTime(ts), v)
			}
		}
	}
}

const time30m = 30 * minute

// A raw sample exactly on the edge between raw and downsampled data is
// counted once: at the end of a 5m block (its last window holds the raw
// sample at the block's end, which the next raw block holds too) and at
// the start of one (the sample at its start belongs to the window before,
// which only raw data holds). Where the local TSDB's raw data begins
// inside a window (its head's oldest sample, a receiver's lookback), that
// window is read raw, not whole beside the raw samples of its end.
func TestSampleOnARawToDownsampledEdgeCountedOnce(t *testing.T) {
	for _, c := range []struct {
		name      string
		ds        int   // the raw block downsampled
		localFrom int64 // where the local TSDB begins (0: none)
	}{
		{"5m then raw", 0, 0},
		{"raw then 5m", 1, 0},
		{"5m then the local TSDB inside a window", 1, t0 + 2*hour + 31*minute + 2_507},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := newDSBucket(t)
			data := gpuSeries("node-001", 2, t0, t0+6*hour, 15_000)
			var raws []block.Meta
			for h := int64(0); h < 6; h += 2 {
				raws = append(raws, d.raw(nil, t0+h*hour, t0+(h+2)*hour, data))
			}
			m := raws[c.ds]
			d.downsample(downsample.Res5m, m.MinTime, m.MaxTime, nil, []block.Meta{m}, m, raws[c.ds+1])
			d.localFrom = c.localFrom
			s := d.store()
			// Samples every 15 s from t0 on (the first GPU's phase is 0):
			// one on every block edge.
			checkLikeRaw(t, d, s, downsample.Res5m, []string{
				"count_over_time(DCGM_FI_DEV_GPU_TEMP[10m])",
				"sum_over_time(DCGM_FI_DEV_GPU_TEMP[10m])",
			}, t0+hour, t0+3*hour, 5*minute, 1e-9)
		})
	}
}

// count/sum/avg_over_time and changes() of a counter over 5m and 1h data
// read its kept samples, not every raw sample: they say so. The functions
// that are exact over whole windows answer as raw and say nothing.
func TestCounterStatisticsSayApproximate(t *testing.T) {
	d := gridBucket(t)
	s := d.store()
	for _, res := range []int64{downsample.Res5m, downsample.Res1h} {
		for _, q := range []string{
			"count_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])",
			"sum_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])",
			"avg_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])",
			"changes(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])",
		} {
			want := d.query(s, block.ResolutionRaw, q, t0+2*hour, t0+11*hour, hour)
			got := d.query(s, res, q, t0+2*hour, t0+11*hour, hour)
			if bad, _ := diff(want, got, 1e-9, 1); len(bad) == 0 {
				t.Errorf("%s over %s data equals raw: the test proves nothing", q, resName(res))
			}
			if !got.hasInfo("approximate answer") {
				t.Errorf("%s over %s data differs from raw without saying so: %q", q, resName(res), got.infos())
			}
		}
		checkLikeRaw(t, d, s, res, []string{
			"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])",
			"resets(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])",
			"max_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])",
			"last_over_time(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])",
			"count_over_time(DCGM_FI_DEV_GPU_TEMP[1h])",
			"avg_over_time(DCGM_FI_DEV_GPU_TEMP[1h])",
			"min_over_time(DCGM_FI_DEV_GPU_TEMP[1h])",
		}, t0+2*hour, t0+11*hour, hour, 1e-6)
	}
}

func resName(res int64) string {
	if res == downsample.Auto {
		return "auto"
	}
	return downsample.ResolutionName(res)
}

// Where raw retention ended (the raw blocks before the edge deleted, their
// 5m blocks left) a panel reads 5m data up to the edge and raw data after
// it. The window that ends at the edge is only in the 5m blocks (the raw
// block that held it is gone): it must be read from them, not handed to the
// raw side for being the finer one, which left every range over it short of
// a window (count_over_time(x[1h]) 56 where Prometheus said 60) and
// increase(x[5m]) at the edge with nothing. Likewise where 5m retention
// ended and 1h data takes over. Compared with the answers of the same
// bucket before retention deleted anything.
func TestRetentionEdgeReadsTheWindowBeforeIt(t *testing.T) {
	d := newDSBucket(t)
	data := gpuSeries("node-001", 2, t0, t0+12*hour, 15_000)
	var raws, fives []block.Meta
	for h := int64(0); h < 12; h += 2 {
		raws = append(raws, d.raw(nil, t0+h*hour, t0+(h+2)*hour, data))
	}
	for i := 0; i+1 < len(raws); i++ {
		fives = append(fives, d.downsample(downsample.Res5m, raws[i].MinTime, raws[i].MaxTime, nil, []block.Meta{raws[i]}, raws[i], raws[i+1]))
	}
	d.downsample(downsample.Res1h, t0, t0+4*hour, nil, fives[:2], fives[:2]...)
	type panel struct {
		q                string
		start, end, step int64
	}
	var panels []panel
	for _, q := range []string{
		"count_over_time(DCGM_FI_DEV_GPU_TEMP[1h])",
		"sum_over_time(DCGM_FI_DEV_GPU_TEMP[1h])",
		"max_over_time(DCGM_FI_DEV_GPU_TEMP[1h])",
		"rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[1h])",
	} {
		panels = append(panels,
			panel{q, t0 + 5*hour, t0 + 9*hour, 5 * minute}, // across the raw → 5m edge at 6h
			panel{q, t0 + 2*hour, t0 + 6*hour, hour},       // across the 5m → 1h edge at 4h
		)
	}
	panels = append(panels, panel{"increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION[5m])", t0 + 5*hour, t0 + 9*hour, 5 * minute})
	s := d.store()
	want := make([]answer, len(panels))
	for i, p := range panels {
		want[i] = d.query(s, block.ResolutionRaw, p.q, p.start, p.end, p.step)
	}
	for _, m := range raws[:3] { // raw retention: the raw blocks before 6h
		d.delete(m)
	}
	for _, m := range fives[:2] { // 5m retention: the 5m blocks before 4h
		d.delete(m)
	}
	s = d.store()
	for i, p := range panels {
		got := d.query(s, downsample.Auto, p.q, p.start, p.end, p.step)
		bad, n := diff(want[i], got, 1e-6, 5)
		if n == 0 {
			t.Fatalf("%s: raw answered nothing", p.q)
		}
		if len(bad) > 0 && !got.hasInfo("approximate") {
			t.Errorf("%s at a %s step from %s: %d points differ from the raw answer without saying so (infos %q):\n%s",
				p.q, fmtDur(p.step), fmtTime(p.start), len(bad), got.infos(), strings.Join(bad, "\n"))
		}
		if got.hasInfo("approximate") {
			t.Errorf("%s at a %s step: said approximate where whole windows answer exactly: %q", p.q, fmtDur(p.step), got.infos())
		}
	}
}
