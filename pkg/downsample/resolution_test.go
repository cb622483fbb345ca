package downsample

import (
	"testing"
	"time"

	"github.com/prometheus/prometheus/storage"
)

func TestMaxResolution(t *testing.T) {
	// Grafana's steps: about 250 points per panel.
	step := func(rng time.Duration) int64 { return (rng / 250).Milliseconds() }
	const day = 24 * time.Hour
	for _, tc := range []struct {
		name  string
		max   int64 // the request's max_source_resolution
		hints *storage.SelectHints
		want  int64
	}{
		{"instant query", Auto, &storage.SelectHints{}, ResRaw},
		{"no hints", Auto, nil, ResRaw},
		{"explicit raw wins", ResRaw, &storage.SelectHints{Step: step(365 * day)}, ResRaw},
		{"explicit 1h wins", Res1h, &storage.SelectHints{Step: 1000, Range: 300_000}, Res1h},
		{"24h plain", Auto, &storage.SelectHints{Step: step(day)}, ResRaw},
		{"24h rate[5m]", Auto, &storage.SelectHints{Step: step(day), Range: 300_000}, ResRaw},
		{"2d plain", Auto, &storage.SelectHints{Step: step(2 * day)}, Res5m},
		{"2d rate[5m]", Auto, &storage.SelectHints{Step: step(2 * day), Range: 300_000}, ResRaw},
		{"7d plain", Auto, &storage.SelectHints{Step: step(7 * day)}, Res5m},
		{"7d rate[5m]", Auto, &storage.SelectHints{Step: step(7 * day), Range: 300_000}, Res5m},
		{"30d plain", Auto, &storage.SelectHints{Step: step(30 * day)}, Res1h},
		{"30d rate[5m]", Auto, &storage.SelectHints{Step: step(30 * day), Range: 300_000}, Res5m},
		{"30d avg_over_time[1h]: a fifth of the step", Auto, &storage.SelectHints{Step: step(30 * day), Range: 3_600_000}, Res5m},
		{"365d rate[5m]", Auto, &storage.SelectHints{Step: step(365 * day), Range: 300_000}, Res5m},
		{"365d rate[1d]", Auto, &storage.SelectHints{Step: step(365 * day), Range: 86_400_000}, Res1h},
		{"plain at a 1h step", Auto, &storage.SelectHints{Step: 3_600_000}, Res5m},
		{"plain at a 2h step", Auto, &storage.SelectHints{Step: 7_200_000}, Res1h},
	} {
		if got := MaxResolution(tc.max, tc.hints); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, ResolutionName(got), ResolutionName(tc.want))
		}
	}
}

// StepShift.Map against its definition, evaluation by evaluation: a point
// at t is read by the evaluation at T when t is in the range ending at the
// last window end e ≤ T, and moved by T - e; Straddled finds the
// evaluation whose span a cut falls inside.
func TestStepShift(t *testing.T) {
	for _, c := range []struct{ first, end, step, rng, res int64 }{
		{27 * 60_000, 12 * Res1h, 27*60_000 + Res5m, Res5m, Res5m},
		{2*Res1h + 150_000, 20 * Res1h, 3 * Res1h, Res1h, Res1h},
		{7*Res1h + 1, 7*Res1h + 1, 0, 2 * Res1h, Res1h}, // one evaluation
	} {
		s := &StepShift{first: c.first, end: c.end, step: c.step, rng: c.rng, res: c.res}
		for x := c.first - 3*c.rng; x <= c.end+c.res; x += 997 {
			want, read := int64(0), false
			var spanFrom, spanTo int64
			inSpan := false
			for at := c.first; at <= c.end; at += max(c.step, 1) {
				e := at - floorMod(at, c.res)
				if x > e-c.rng && x <= e {
					want, read = x+at-e, true
				}
				if x > e-c.rng+1 && x < at+1 {
					spanFrom, spanTo, inSpan = e-c.rng+1, at+1, true
				}
				if c.step == 0 {
					break
				}
			}
			if got, ok := s.Map(x); ok != read || got != want {
				t.Fatalf("%+v: Map(%d) = %d, %v; want %d, %v", c, x, got, ok, want, read)
			}
			if from, to, ok := s.Straddled(x); ok != inSpan || ok && (from != spanFrom || to != spanTo) {
				t.Fatalf("%+v: Straddled(%d) = %d, %d, %v; want %d, %d, %v", c, x, from, to, ok, spanFrom, spanTo, inSpan)
			}
		}
	}
}

// WindowFit classes, from the hints the engine gives a range function's
// select (Start = first evaluation - range + 1 - offset).
func TestWindowFit(t *testing.T) {
	const at = true              // the selects are evaluated at their steps
	const t0 = 1_767_225_600_000 // a multiple of 1h
	h := func(first, rng, step, n int64) *storage.SelectHints {
		return &storage.SelectHints{Start: first - rng + 1, End: first + n*step, Step: step, Range: rng}
	}
	for _, c := range []struct {
		name    string
		atSteps bool
		h       *storage.SelectHints
		res     int64
		want    Fit
	}{
		{"on the grid", at, h(t0, Res5m, 30*60_000, 10), Res5m, Fits},
		{"plain selector", at, &storage.SelectHints{Start: t0, End: t0 + Res1h, Step: 27 * 60_000}, Res1h, Fits},
		{"$__rate_interval", at, h(t0, 30*60_000+15_000, 30*60_000, 10), Res5m, FitsNearly},
		{"range of 2 windows and a bit", at, h(t0, 2*Res5m+15_000, 30*60_000, 10), Res5m, FitsNot},
		{"27m step", at, h(t0, Res5m, 27*60_000, 10), Res5m, FitsShifted},
		{"start +2m30s", at, h(t0+150_000, Res5m, 30*60_000, 10), Res5m, FitsShifted},
		{"steps too close to move", at, h(t0+150_000, Res5m, 7*60_000, 10), Res5m, FitsNot},
		{"one evaluation off the grid", false, h(t0+1, Res1h, 0, 0), Res1h, FitsShifted},
		{"a range query's one step, judged by its step", at, h(t0, 30*60_000, 27*60_000, 0), Res5m, FitsNot},
		{"times unknown (subquery)", false, h(t0, Res5m, 30*60_000, 10), Res5m, FitsNot},
		{"raw", at, h(t0+1, 7_000, 13_000, 10), ResRaw, Fits},
	} {
		if got := WindowFit(c.atSteps, c.h, c.res); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
