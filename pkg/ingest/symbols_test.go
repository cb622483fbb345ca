//go:build dedupelabels

package ingest

import (
	"net/http"
	"testing"

	"github.com/prometheus/prometheus/prompb"
)

// TestNewSeriesInTenantSymbols: under the dedupelabels build a written
// series' labels are built in its tenant's symbol table (one copy of each
// name and value per tenant), not in a table of their own.
func TestNewSeriesInTenantSymbols(t *testing.T) {
	ti := newTestIngester(t)
	now := nowMs()
	write := func(gpu string) {
		resp := ti.post(t, ctV1, encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
			v1Series([]prompb.Sample{{Timestamp: now, Value: 1}}, "__name__", "DCGM_FI_DEV_GPU_TEMP", "Hostname", "node-1", "gpu", gpu),
		}}))
		if resp.code != http.StatusNoContent {
			t.Fatalf("status %d: %s", resp.code, resp.body)
		}
	}
	write("0")
	st := ti.dbs.Existing("default").Symbols()
	n := st.Len()
	if n < 6 {
		t.Fatalf("the tenant's table holds %d symbols after a series of 3 labels: its labels were built elsewhere", n)
	}
	write("1") // one new value
	if got := st.Len(); got != n+1 {
		t.Errorf("a second GPU's series added %d symbols to the tenant's table, want 1", got-n)
	}
}
