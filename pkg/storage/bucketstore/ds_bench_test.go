package bucketstore

import (
	"context"
	"fmt"
	"math"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/value"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// BenchmarkDownsampledCounters runs chargeback and panel queries of a GPU
// energy counter over 8 days of 5m and 1h data (raw retention over): 16
// GPUs' series that cover the whole range, and their pods' series, a job
// of 3 to 27 hours after another, which begin and end inside the ranges;
// and panels of the GPUs' temperature beside them. Built once per run (a
// bucket in memory): ~2.3M raw samples in four 2-day blocks, their 5m
// blocks and a 1h block of the first 6 days.
func BenchmarkDownsampledCounters(b *testing.B) {
	d := newDSBucket(b)
	var data []rawData
	for g := range 16 {
		gpu := rawData{lset: labels.FromStrings("__name__", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Hostname", "node-001", "gpu", fmt.Sprint(g))}
		temp := rawData{lset: labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "Hostname", "node-001", "gpu", fmt.Sprint(g))}
		var pods []rawData
		var pod *rawData
		podEnd := int64(0)
		mj := 1e12 * float64(g+1)
		for ts := t0 + int64(g)*937; ts < t0+8*24*hour; ts += 15_000 {
			mj += (300 + 250*math.Sin(float64(ts)/float64(17*minute)+float64(g))) * 15_000
			gpu.ts, gpu.fs = append(gpu.ts, ts), append(gpu.fs, math.Round(mj))
			temp.ts, temp.fs = append(temp.ts, ts), append(temp.fs, math.Round(40+float64(ts/15_000%40)))
			if ts >= podEnd {
				if pod != nil {
					pod.ts, pod.fs = append(pod.ts, ts), append(pod.fs, math.Float64frombits(value.StaleNaN))
					pods = append(pods, *pod)
				}
				n := len(pods)
				pod = &rawData{lset: labels.FromStrings("__name__", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Hostname", "node-001",
					"gpu", fmt.Sprint(g), "namespace", fmt.Sprintf("team-%d", (g+n)%4), "pod", fmt.Sprintf("job-%d-%d", g, n))}
				podEnd = ts + int64(3+(g*7+n*11)%25)*hour + int64(n*7_919)
			}
			pod.ts, pod.fs = append(pod.ts, ts), append(pod.fs, math.Round(mj))
		}
		data = append(append(data, gpu, temp), append(pods, *pod)...)
	}
	var raws, fives []block.Meta
	for day := int64(0); day < 8; day += 2 {
		raws = append(raws, d.raw(nil, t0+day*24*hour, t0+(day+2)*24*hour, data))
	}
	for i := 0; i+1 < len(raws); i++ {
		fives = append(fives, d.downsample(downsample.Res5m, raws[i].MinTime, raws[i].MaxTime, nil, []block.Meta{raws[i]}, raws[i], raws[i+1]))
	}
	d.downsample(downsample.Res1h, t0, t0+6*24*hour, nil, fives, fives...)
	for _, m := range raws[:3] {
		d.delete(m)
	}
	cfg := DefaultConfig()
	cfg.DeletionMarkDelay, cfg.BucketIndexEnabled = 0, false
	s, err := New(cfg, d.bkt, quietLogger(), nil)
	if err != nil {
		b.Fatal(err)
	}
	if err := s.Sync(context.Background()); err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name, q string
		res     int64
		step    int64
	}{
		{"chargeback-1h", `sum by (namespace) (increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{pod!=""}[1d]))`, downsample.Res1h, 24 * hour},
		{"rate1h-1h", `sum by (gpu) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{pod=""}[1h]))`, downsample.Res1h, hour},
		{"rate1h-5m", `sum by (namespace) (rate(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{pod!=""}[1h]))`, downsample.Res5m, 5 * minute},
		{"max1h-5m", `max by (gpu) (max_over_time(DCGM_FI_DEV_GPU_TEMP[1h]))`, downsample.Res5m, 5 * minute},
		{"avg-1h", `avg(DCGM_FI_DEV_GPU_TEMP)`, downsample.Res1h, hour},
	} {
		b.Run(c.name, func(b *testing.B) {
			for b.Loop() {
				if got := d.query(s, c.res, c.q, t0+24*hour, t0+6*24*hour, c.step); len(got.points) == 0 {
					b.Fatal("no answer")
				}
			}
		})
	}
}
