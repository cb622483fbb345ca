package load

import (
	"strings"
	"testing"
	"time"
)

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 1; i <= 100; i++ {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]time.Duration{50: 50 * time.Millisecond, 90: 90 * time.Millisecond,
		99: 99 * time.Millisecond, 100: 100 * time.Millisecond, 0.1: time.Millisecond} {
		if got := Percentile(d, p); got != want {
			t.Errorf("p%v = %v; want %v", p, got, want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("empty: want 0")
	}
	// Nearest rank on few values: p99 of 10 values is the largest.
	few := []time.Duration{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	if Percentile(few, 99) != 10 || Percentile(few, 50) != 5 {
		t.Errorf("p99, p50 of 1..10 = %v, %v", Percentile(few, 99), Percentile(few, 50))
	}
}

func TestSummarizeUnsorted(t *testing.T) {
	var l Latencies
	for _, ms := range []int{30, 10, 20, 40} {
		l.Add(time.Duration(ms) * time.Millisecond)
	}
	s := l.Summary()
	if s.N != 4 || s.P50 != 20*time.Millisecond || s.Max != 40*time.Millisecond || s.Avg != 25*time.Millisecond {
		t.Fatalf("summary %+v", s)
	}
	if !strings.Contains(s.String(), "p50=20.0ms") {
		t.Errorf("String() = %q", s.String())
	}
}

func TestCodes(t *testing.T) {
	var c Codes
	for _, code := range []int{204, 204, 400, 0, 503} {
		c.Add(code)
	}
	if got, want := FormatCodes(c.Snapshot()), "neterr:1 204:2 400:1 503:1"; got != want {
		t.Errorf("FormatCodes = %q; want %q", got, want)
	}
	if FormatCodes(nil) != "none" {
		t.Error("empty codes")
	}
}

func TestFmtDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0", 500 * time.Microsecond: "500µs", 2500 * time.Microsecond: "2.50ms",
		25 * time.Millisecond: "25.0ms", 250 * time.Millisecond: "250ms", 2500 * time.Millisecond: "2.50s", 25 * time.Second: "25.0s",
	} {
		if got := FmtDuration(d); got != want {
			t.Errorf("FmtDuration(%v) = %q; want %q", d, got, want)
		}
	}
}

func TestTable(t *testing.T) {
	tb := Table{Header: []string{"metric", "gpustore", "prometheus"}}
	tb.AddRow("samples/s", "475289", "187424")
	tb.AddRow("RSS per series, KiB", "2.5")
	want := "" +
		"| metric              | gpustore | prometheus |\n" +
		"| ------------------- | -------: | ---------: |\n" +
		"| samples/s           |   475289 |     187424 |\n" +
		"| RSS per series, KiB |      2.5 |            |\n"
	if got := tb.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
}

func TestGrafanaStep(t *testing.T) {
	for _, c := range []struct {
		rng, scrape, want time.Duration
	}{
		{time.Hour, 15 * time.Second, 15 * time.Second},  // 14.4s → at least the scrape interval
		{24 * time.Hour, time.Minute, 346 * time.Second}, // 345.6s
		{7 * 24 * time.Hour, time.Minute, 2419 * time.Second},
		{time.Minute, 0, time.Second},
	} {
		if got := GrafanaStep(c.rng, c.scrape); got != c.want {
			t.Errorf("GrafanaStep(%v, %v) = %v; want %v", c.rng, c.scrape, got, c.want)
		}
	}
}
