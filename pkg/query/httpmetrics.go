package query

import (
	"net/http"
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// apiPrefix is where the API is mounted; handler names carry it, as
// Prometheus' own prometheus_http_requests_total does.
const apiPrefix = "/api/v1"

// otherHandler names a request whose path is no route of the API (answered
// 404), so that unknown paths cannot grow the metrics' label values.
const otherHandler = "other"

// httpMetrics counts and times the query API's requests by route: the
// route's pattern in Prometheus' router ("/api/v1/label/:name/values"), never
// the raw path, so the handler label has as many values as the API has
// routes. Requests are measured at the outermost handler: answers the tenant
// check, the subquery bound or the results cache give before the router
// count as well, and the query frontend's pieces of one query_range are not
// counted again.
type httpMetrics struct {
	routes   []routePattern
	handlers map[string]func(http.Handler) http.Handler // by route name
}

// routePattern is one route, split at "/" ("" for the root).
type routePattern struct {
	name     string
	segments []string
}

func newHTTPMetrics(reg prometheus.Registerer, names []string) *httpMetrics {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "gpustore_query_http_requests_total",
		Help: "Requests to the query API by route (Prometheus' route pattern; \"other\" for an unknown path) and HTTP status code.",
	}, []string{"handler", "code"})
	duration := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:                        "gpustore_query_http_request_duration_seconds",
		Help:                        "Time to answer a query API request, by route, from its headers to the end of the (compressed) answer.",
		Buckets:                     []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120},
		NativeHistogramBucketFactor: 1.1,
	}, []string{"handler"})
	if reg != nil {
		reg.MustRegister(requests, duration)
	}
	m := &httpMetrics{handlers: map[string]func(http.Handler) http.Handler{}}
	for _, n := range append(names, otherHandler) {
		if _, ok := m.handlers[n]; ok {
			continue
		}
		l := prometheus.Labels{"handler": n}
		c, d := requests.MustCurryWith(l), duration.MustCurryWith(l)
		m.handlers[n] = func(h http.Handler) http.Handler {
			return promhttp.InstrumentHandlerDuration(d, promhttp.InstrumentHandlerCounter(c, h))
		}
		if n != otherHandler && !strings.Contains(n, "*") { // a catch-all is OPTIONS' (CORS), not a route of its own
			m.routes = append(m.routes, routePattern{name: n, segments: strings.Split(n, "/")})
		}
	}
	// Static routes before those with parameters: httprouter prefers a
	// static segment where both could match.
	slices.SortStableFunc(m.routes, func(a, b routePattern) int {
		return strings.Count(a.name, ":") - strings.Count(b.name, ":")
	})
	return m
}

// instrument wraps h, which serves the routes under apiPrefix.
func (m *httpMetrics) instrument(h http.Handler) http.Handler {
	wrapped := make(map[string]http.Handler, len(m.handlers))
	for n, wrap := range m.handlers {
		wrapped[n] = wrap(h)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		wrapped[m.route(r.URL.Path)].ServeHTTP(w, r)
	})
}

// route returns the name of the route path belongs to, or otherHandler.
func (m *httpMetrics) route(path string) string {
	segs := strings.Split(path, "/")
	for _, p := range m.routes {
		if matches(p.segments, segs) {
			return p.name
		}
	}
	return otherHandler
}

// matches reports whether path's segments fit a pattern's: equal, or any
// non-empty segment where the pattern has a parameter (":name").
func matches(pattern, path []string) bool {
	if len(pattern) != len(path) {
		return false
	}
	for i, s := range pattern {
		if s != path[i] && (!strings.HasPrefix(s, ":") || path[i] == "") {
			return false
		}
	}
	return true
}

// recordRoute is a router instrumentation that adds each route's name,
// under apiPrefix, to names as the API registers it.
func recordRoute(names *[]string) func(string, http.HandlerFunc) http.HandlerFunc {
	return func(name string, h http.HandlerFunc) http.HandlerFunc {
		*names = append(*names, apiPrefix+name)
		return h
	}
}
