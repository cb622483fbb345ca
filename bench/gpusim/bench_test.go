package gpusim

import (
	"testing"
	"time"
)

// The benchmarks use the default 1024-GPU cluster stepped at 15 s.

func benchCluster(b *testing.B, target bool) *Cluster {
	b.Helper()
	c := newTestCluster(b, Config{Seed: 1, TargetLabels: target})
	c.Step(t0) // catch-up from the epoch happens here, not in the loop
	return c
}

func BenchmarkStep(b *testing.B) {
	c := benchCluster(b, true)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.Step(t0.Add(time.Duration(i+1) * 15 * time.Second))
	}
	b.ReportMetric(float64(c.SeriesCount()), "series")
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(c.SeriesCount()), "ns/series")
}

func BenchmarkAppendSamples(b *testing.B) {
	c := benchCluster(b, true)
	buf := c.AppendSamples(nil, t0, Replica{Name: "p0"})
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		buf = c.AppendSamples(buf[:0], t0.Add(time.Duration(i+1)*15*time.Second), Replica{Name: "p1", Offset: 300 * time.Millisecond, Jitter: 0.001})
	}
}

func benchEncode(b *testing.B, v2 bool) {
	c := benchCluster(b, true)
	series := c.AppendSamples(nil, t0, Replica{Name: "p0"})
	enc := NewEncoder([]Label{{"cluster", "gpu-cluster-prod-01"}, {"__replica__", "p0"}})
	const batch = 2000
	var bytes, samples int
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		off := (i * batch) % (len(series) - batch)
		var body []byte
		if v2 {
			body = enc.EncodeV2(series[off : off+batch])
		} else {
			body = enc.EncodeV1(series[off : off+batch])
		}
		bytes += len(body)
		samples += batch
	}
	b.ReportMetric(float64(bytes)/float64(samples), "bytes/sample")
	b.ReportMetric(float64(samples)/b.Elapsed().Seconds(), "samples/s")
}

func BenchmarkEncodeV1(b *testing.B) { benchEncode(b, false) }
func BenchmarkEncodeV2(b *testing.B) { benchEncode(b, true) }

func BenchmarkMetricsPage(b *testing.B) {
	c := benchCluster(b, false)
	buf := c.AppendText(nil)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.Step(t0.Add(time.Duration(i+1) * 15 * time.Second))
		buf = c.AppendText(buf[:0])
	}
	b.ReportMetric(float64(len(buf)), "page-bytes")
}
