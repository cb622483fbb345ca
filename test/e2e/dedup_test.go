package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/golang/snappy"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/prompb"

	"github.com/gpustore/gpustore/pkg/app"
)

// TestQueryTimeDedupKeepsEveryReplicasData is issue 9's reproduction from
// outside: with the HA tracker off, replica p1 writes 4 h of 8 GPU series
// (one sample per 15 s), replica p0 only the last 2 h. Query-time dedup
// (on by default) must answer p1's 7,680 samples, not p0's half; and the
// same with 2 h and 1 h. p0 sorts first, so a merge that starts on the
// first replica rather than the earliest sample hides p1's first hours.
func TestQueryTimeDedupKeepsEveryReplicasData(t *testing.T) {
	_, url := startGpustore(t, func(c *app.Config) { c.HA.Enabled = false })
	end := time.Now().Truncate(15 * time.Second)
	cases := []struct {
		cluster          string
		p1From, p0From   time.Duration // before end
		window           string
		dedup, undeduped float64
	}{
		{"a", 4 * time.Hour, 2 * time.Hour, "5h", 7680, 7680 + 3840},
		{"b", 2 * time.Hour, time.Hour, "3h", 3840, 3840 + 1920},
	}
	// Both replicas send in time order, as Prometheus does, 10 minutes a request.
	start := end.Add(-4 * time.Hour).UnixMilli()
	for from := start; from < end.UnixMilli(); from += 10 * 60_000 {
		req := &prompb.WriteRequest{}
		for _, c := range cases {
			for _, r := range []struct {
				name string
				from int64
			}{{"p0", end.Add(-c.p0From).UnixMilli()}, {"p1", end.Add(-c.p1From).UnixMilli()}} {
				for g := range 8 {
					ts := prompb.TimeSeries{Labels: []prompb.Label{
						{Name: "__name__", Value: "DCGM_FI_DEV_GPU_TEMP"},
						{Name: "__replica__", Value: r.name},
						{Name: "cluster", Value: c.cluster},
						{Name: "gpu", Value: fmt.Sprint(g)},
					}}
					for t := max(from, r.from); t < min(from+10*60_000, end.UnixMilli()); t += 15_000 {
						ts.Samples = append(ts.Samples, prompb.Sample{Timestamp: t, Value: float64(60 + g)})
					}
					if len(ts.Samples) > 0 {
						req.Timeseries = append(req.Timeseries, ts)
					}
				}
			}
		}
		remoteWrite(t, url, req)
	}

	api := promClient(t, url)
	for _, c := range cases {
		expr := fmt.Sprintf(`sum(count_over_time(DCGM_FI_DEV_GPU_TEMP{cluster=%q}[%s]))`, c.cluster, c.window)
		v, _, _, err := api.Query(context.Background(), expr, end)
		if err != nil {
			t.Fatal(err)
		}
		if vec, ok := v.(model.Vector); !ok || len(vec) != 1 || float64(vec[0].Value) != c.dedup {
			t.Errorf("%s = %v, want %v (every sample of the replica that was up the whole time)", expr, v, c.dedup)
		}
		raw, err := queryNoDedup(url, expr, end)
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) != 1 || float64(raw[0].Value) != c.undeduped {
			t.Errorf("%s with dedup=false = %v, want %v", expr, raw, c.undeduped)
		}
	}
}

func remoteWrite(t *testing.T, url string, req *prompb.WriteRequest) {
	t.Helper()
	raw, err := req.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	hreq, _ := http.NewRequest(http.MethodPost, url+"/api/v1/write", bytes.NewReader(snappy.Encode(nil, raw)))
	hreq.Header.Set("Content-Type", "application/x-protobuf")
	hreq.Header.Set("Content-Encoding", "snappy")
	hreq.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	resp, err := http.DefaultClient.Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("remote write: %d %s", resp.StatusCode, body)
	}
}
