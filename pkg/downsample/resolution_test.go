package downsample

import (
	"context"
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
		ctx   context.Context
		hints *storage.SelectHints
		want  int64
	}{
		{"instant query", context.Background(), &storage.SelectHints{}, ResRaw},
		{"no hints", context.Background(), nil, ResRaw},
		{"explicit raw wins", WithMaxSourceResolution(context.Background(), ResRaw), &storage.SelectHints{Step: step(365 * day)}, ResRaw},
		{"explicit 1h wins", WithMaxSourceResolution(context.Background(), Res1h), &storage.SelectHints{Step: 1000, Range: 300_000}, Res1h},
		{"24h plain", context.Background(), &storage.SelectHints{Step: step(day)}, ResRaw},
		{"24h rate[5m]", context.Background(), &storage.SelectHints{Step: step(day), Range: 300_000}, ResRaw},
		{"2d plain", context.Background(), &storage.SelectHints{Step: step(2 * day)}, Res5m},
		{"2d rate[5m]", context.Background(), &storage.SelectHints{Step: step(2 * day), Range: 300_000}, ResRaw},
		{"7d plain", context.Background(), &storage.SelectHints{Step: step(7 * day)}, Res5m},
		{"7d rate[5m]", context.Background(), &storage.SelectHints{Step: step(7 * day), Range: 300_000}, Res5m},
		{"30d plain", context.Background(), &storage.SelectHints{Step: step(30 * day)}, Res1h},
		{"30d rate[5m]", context.Background(), &storage.SelectHints{Step: step(30 * day), Range: 300_000}, Res5m},
		{"30d avg_over_time[1h]: a fifth of the step", context.Background(), &storage.SelectHints{Step: step(30 * day), Range: 3_600_000}, Res5m},
		{"365d rate[5m]", context.Background(), &storage.SelectHints{Step: step(365 * day), Range: 300_000}, Res5m},
		{"365d rate[1d]", context.Background(), &storage.SelectHints{Step: step(365 * day), Range: 86_400_000}, Res1h},
		{"plain at a 1h step", context.Background(), &storage.SelectHints{Step: 3_600_000}, Res5m},
		{"plain at a 2h step", context.Background(), &storage.SelectHints{Step: 7_200_000}, Res1h},
	} {
		if got := MaxResolution(tc.ctx, tc.hints); got != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, ResolutionName(got), ResolutionName(tc.want))
		}
	}
}
