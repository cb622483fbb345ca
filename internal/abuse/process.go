// The footprint of a server in another process, read from its /metrics:
// what the soak's abuse run compares before and after the abuse.

package abuse

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Resources are the gauges of a Go server's /metrics (client_golang's Go
// and process collectors) a leak shows in: goroutines, open files, resident
// memory and the Go heap in use.
var Resources = []string{"go_goroutines", "process_open_fds", "process_resident_memory_bytes", "go_memstats_heap_inuse_bytes"}

// Server reads the footprint of a Go server in another process.
type Server struct {
	Base   string      // http://host:port
	Header http.Header // added to each request: an admin identity's basic auth
	// Collect runs a garbage collection in the server before each reading
	// (net/http/pprof's /debug/pprof/heap?gc=1), so that the heap in use is
	// what is live, not what the last cycle left.
	Collect bool
}

func (s Server) get(ctx context.Context, path string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.Base+path, nil)
	if err != nil {
		return nil, err
	}
	for k, vs := range s.Header {
		req.Header[k] = vs
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("%s: %s", path, resp.Status)
	}
	return resp, nil
}

// Values reads the named metrics from the server's /metrics, each summed
// over its series (gauges, counters and untyped alike). A name with no
// series on the page is an error.
func (s Server) Values(ctx context.Context, names ...string) (map[string]float64, error) {
	if s.Collect {
		if err := s.HeapProfile(ctx, io.Discard); err != nil {
			return nil, fmt.Errorf("collect garbage: %w", err)
		}
	}
	resp, err := s.get(ctx, "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("/metrics: %w", err)
	}
	out := make(map[string]float64, len(names))
	var missing []string
	for _, name := range names {
		ms := fams[name].GetMetric()
		if len(ms) == 0 {
			missing = append(missing, name)
		}
		for _, m := range ms {
			out[name] += m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("/metrics lacks %s", strings.Join(missing, ", "))
	}
	return out, nil
}

// SettlesTo reads the values of baseline until each is at most its baseline
// value plus its slack (0 when slack lacks it), for up to d. It returns the
// last reading; the error names every gauge still above its bound then.
func (s Server) SettlesTo(ctx context.Context, baseline, slack map[string]float64, d time.Duration) (map[string]float64, error) {
	names := make([]string, 0, len(baseline))
	for name := range baseline {
		names = append(names, name)
	}
	slices.Sort(names)
	var last map[string]float64
	var err error
	for deadline := time.Now().Add(d); ; time.Sleep(time.Second) {
		if last, err = s.Values(ctx, names...); err == nil {
			var over []error
			for _, name := range names {
				if bound := baseline[name] + slack[name]; last[name] > bound {
					over = append(over, fmt.Errorf("%s %.0f > %.0f (baseline %.0f + slack %.0f)", name, last[name], bound, baseline[name], slack[name]))
				}
			}
			err = errors.Join(over...)
		}
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		return last, fmt.Errorf("not settled after %s: %w", d, err)
	}
	return last, nil
}

// HeapProfile writes the server's heap profile, after a collection, to w:
// what `go tool pprof -diff_base` compares to find what a run left behind.
func (s Server) HeapProfile(ctx context.Context, w io.Writer) error {
	resp, err := s.get(ctx, "/debug/pprof/heap?gc=1")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, err = io.Copy(w, resp.Body)
	return err
}
