package query

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkQueryHTTPInstrument is what the query API's metrics add to a
// request: naming its route among Prometheus' ~60 and counting and timing
// it, around a handler that does nothing.
func BenchmarkQueryHTTPInstrument(b *testing.B) {
	var names []string
	for _, r := range []string{"/query", "/query_range", "/series", "/labels", "/label/:name/values", "/metadata", "/status/buildinfo", "/rules", "/alerts", "/query_exemplars"} {
		names = append(names, apiPrefix+r)
	}
	nop := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	for _, c := range []struct {
		name string
		h    http.Handler
	}{
		{"bare", nop},
		{"instrumented", newHTTPMetrics(prometheus.NewRegistry(), names).instrument(nop)},
	} {
		b.Run(c.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodGet, "/api/v1/label/gpu/values", nil)
			w := httptest.NewRecorder()
			b.ReportAllocs()
			for b.Loop() {
				c.h.ServeHTTP(w, req)
			}
		})
	}
}
