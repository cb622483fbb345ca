package receivers

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"

	"github.com/grafana/dskit/ring"

	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// TenantsPath is where a receiver lists the tenants it holds data for (an
// operator's route: it names every tenant).
const TenantsPath = "/receiver/tenants"

// tenantsAnswer is TenantsPath's JSON body.
type tenantsAnswer struct {
	Tenants []string `json:"tenants"`
}

// TenantsHandler lists the tenants of dbs, sorted.
func TenantsHandler(dbs *tenantdb.Manager) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "only GET", http.StatusMethodNotAllowed)
			return
		}
		ts := dbs.Tenants()
		slices.Sort(ts)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(tenantsAnswer{Tenants: ts})
	})
}

// Tenants lists the tenants any healthy receiver of the ring (but Self)
// holds data for: the union of their answers, sorted. A tenant is on
// replication-factor receivers, so a receiver that fails to answer is
// reported in the error beside the union of the others'; the error alone
// when none answered.
func (s *Source) Tenants(ctx context.Context) ([]string, error) {
	rs, err := s.ring.GetAllHealthy(ring.Read)
	if err != nil {
		return nil, fmt.Errorf("receivers: ring: %w", err)
	}
	var (
		mtx     sync.Mutex
		union   = map[string]bool{}
		errs    []error
		wg      sync.WaitGroup
		answers int
	)
	for _, inst := range rs.Instances {
		if s.cfg.Self != "" && inst.Id == s.cfg.Self {
			continue
		}
		wg.Go(func() {
			ts, err := s.tenantsOf(ctx, inst)
			mtx.Lock()
			defer mtx.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("receiver %s (%s): %w", inst.Id, inst.Addr, err))
				return
			}
			answers++
			for _, t := range ts {
				union[t] = true
			}
		})
	}
	wg.Wait()
	out := make([]string, 0, len(union))
	for t := range union {
		out = append(out, t)
	}
	slices.Sort(out)
	if len(errs) > 0 {
		err := fmt.Errorf("receivers: listing tenants: %d of %d failed: %w", len(errs), len(errs)+answers, errs[0])
		if answers == 0 {
			return nil, err
		}
		return out, err
	}
	return out, nil
}

func (s *Source) tenantsOf(ctx context.Context, inst ring.InstanceDesc) ([]string, error) {
	u := url.URL{Scheme: s.cfg.Scheme, Host: inst.Addr, Path: TenantsPath}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return nil, err
	}
	resp, err := s.httpClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", u.String(), resp.Status)
	}
	var a tenantsAnswer
	if err := json.NewDecoder(io.LimitReader(resp.Body, 16<<20)).Decode(&a); err != nil {
		return nil, fmt.Errorf("%s: %w", u.String(), err)
	}
	return a.Tenants, nil
}
