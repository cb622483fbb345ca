package ringread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"sync"

	"github.com/grafana/dskit/ring"

	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// TenantsPath is where a receiver lists the tenants it holds data for (an
// internal route of the ring: it names every tenant).
const TenantsPath = "/receiver/tenants"

// tenantsAnswer is TenantsPath's JSON body.
type tenantsAnswer struct {
	Tenants []string `json:"tenants"`
}

// TenantsHandler lists the tenants of dbs, sorted.
func TenantsHandler(dbs *tenantdb.Manager) http.Handler {
	return getOnly(func(w http.ResponseWriter, _ *http.Request) {
		ts := dbs.Tenants()
		slices.Sort(ts)
		writeJSON(w, tenantsAnswer{Tenants: ts})
	})
}

// Tenants lists the tenants any healthy receiver of the ring (but Self)
// holds data for: the union of their answers, sorted. A tenant is on
// replication-factor receivers, so a receiver that fails to answer is
// reported in the error beside the union of the others'; the error alone
// when none answered.
func (s *Source) Tenants(ctx context.Context) ([]string, error) {
	union := map[string]bool{}
	err := askEach(ctx, s, TenantsPath, "", "listing tenants", func(a tenantsAnswer) {
		for _, t := range a.Tenants {
			union[t] = true
		}
	})
	if errors.Is(err, errNoAnswer) {
		return nil, err
	}
	out := make([]string, 0, len(union))
	for t := range union {
		out = append(out, t)
	}
	slices.Sort(out)
	return out, err
}

// errNoAnswer is askEach's error when no receiver answered.
var errNoAnswer = errors.New("no receiver answered")

// askEach GETs path from every healthy receiver of the ring (of the
// tenant's shard, when tenant is not "": see ringOf) but Self,
// concurrently (as tenant when tenant is not ""), decodes each JSON answer
// as a T and hands it to merge, one at a time. Failed receivers are
// reported in the error, which wraps errNoAnswer when none answered: what
// is asked for is on replication-factor receivers, so the others' answers
// usually hold it all.
func askEach[T any](ctx context.Context, s *Source, path, tenant, what string, merge func(T)) error {
	r := s.ring
	if tenant != "" {
		r = s.ringOf(tenant)
	}
	rs, err := r.GetAllHealthy(ring.Read)
	if err != nil {
		return fmt.Errorf("receivers: %s: ring: %w: %w", what, errNoAnswer, err)
	}
	var (
		mtx     sync.Mutex
		errs    []error
		wg      sync.WaitGroup
		answers int
	)
	for _, inst := range rs.Instances {
		if s.cfg.Self != "" && inst.Id == s.cfg.Self {
			continue
		}
		wg.Go(func() {
			var a T
			err := s.get(ctx, inst, path, tenant, func(body io.Reader) error { return json.NewDecoder(body).Decode(&a) })
			mtx.Lock()
			defer mtx.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("receiver %s (%s): %w", inst.Id, inst.Addr, err))
				return
			}
			answers++
			merge(a)
		})
	}
	wg.Wait()
	switch {
	case len(errs) == 0:
		return nil
	case answers == 0:
		return fmt.Errorf("receivers: %s: %w: %w", what, errNoAnswer, errors.Join(errs...))
	}
	return fmt.Errorf("receivers: %s: %d of %d failed: %w", what, len(errs), len(errs)+answers, errs[0])
}

// get GETs path from inst and hands the body (at most 16 MiB) to read.
func (s *Source) get(ctx context.Context, inst ring.InstanceDesc, path, tenant string, read func(io.Reader) error) error {
	u := url.URL{Scheme: s.cfg.Scheme, Host: inst.Addr, Path: path}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.String(), nil)
	if err != nil {
		return err
	}
	if tenant != "" {
		req.Header.Set(tenancy.OrgIDHeader, tenant)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", u.String(), resp.Status)
	}
	if err := read(io.LimitReader(resp.Body, 16<<20)); err != nil {
		return fmt.Errorf("%s: %w", u.String(), err)
	}
	return nil
}

// getOnly answers methods other than GET with 405.
func getOnly(f http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet {
			w.Header().Set("Allow", http.MethodGet)
			http.Error(w, "only GET", http.StatusMethodNotAllowed)
			return
		}
		f(w, r)
	})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
