package query

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/grafana/dskit/tenant"
	v1 "github.com/prometheus/prometheus/web/api/v1"

	"github.com/gpustore/gpustore/pkg/tenancy"
)

// Admin carries out the operations of Prometheus' TSDB admin API for one
// tenant (pkg/app wires the tenant's TSDB, the bucket and the caches).
type Admin interface {
	// DeleteSeries deletes the samples in [mint, maxt] of the series
	// matching any of the selectors, everywhere the tenant's queries read.
	DeleteSeries(ctx context.Context, tenantID string, selectors []string, mint, maxt int64) error
	// CleanTombstones rewrites the tenant's local blocks without their
	// deleted samples.
	CleanTombstones(ctx context.Context, tenantID string) error
	// Snapshot writes a snapshot of the tenant's TSDB and returns its name.
	Snapshot(ctx context.Context, tenantID string, skipHead bool) (string, error)
}

// adminHandlers serve POST|PUT /api/v1/admin/tsdb/{delete_series,
// clean_tombstones,snapshot} as Prometheus does, for the request's tenant,
// to identities allowed every tenant only (tenancy.Admin): deleting is not
// an operation for a tenant's own readers and writers.
func (a *API) registerAdmin(mux interface {
	Handle(string, http.Handler)
}, wrap func(http.Handler) http.Handler) {
	if a.opts.Admin == nil {
		return // the v1 handler answers: admin APIs disabled (404)
	}
	for name, h := range map[string]func(w http.ResponseWriter, r *http.Request, tenantID string) error{
		"delete_series":    a.deleteSeries,
		"clean_tombstones": a.cleanTombstones,
		"snapshot":         a.snapshot,
	} {
		mux.Handle(apiPrefix+"/admin/tsdb/"+name, wrap(a.admin(h)))
	}
}

func (a *API) admin(h func(w http.ResponseWriter, r *http.Request, tenantID string) error) http.Handler {
	return a.tenant(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost && r.Method != http.MethodPut {
			w.Header().Set("Allow", "POST, PUT")
			writeError(w, http.StatusMethodNotAllowed, "bad_data", errors.New("use POST or PUT"))
			return
		}
		if err := a.opts.Tenants.Admin(r); err != nil {
			status := http.StatusForbidden
			if te, ok := errors.AsType[*tenancy.Error](err); ok {
				status = te.Status
			}
			writeError(w, status, "bad_data", err)
			return
		}
		tenantID, err := tenant.TenantID(r.Context())
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad_data", err)
			return
		}
		if err := h(w, r, tenantID); err != nil {
			if he, ok := errors.AsType[*badRequest](err); ok {
				writeError(w, http.StatusBadRequest, "bad_data", he.err)
				return
			}
			if errors.Is(err, ErrNoTenantData) {
				writeError(w, http.StatusNotFound, "not_found", err)
				return
			}
			a.opts.Logger.Error("admin API", "path", r.URL.Path, "tenant", tenantID, "err", err)
			writeError(w, http.StatusInternalServerError, "internal", err)
		}
	}))
}

// ErrNoTenantData is wrapped by an Admin's error when the tenant has no
// database in this process (answered 404).
var ErrNoTenantData = errors.New("the tenant has no data in this process")

type badRequest struct{ err error }

func (e *badRequest) Error() string { return e.err.Error() }

func (a *API) deleteSeries(w http.ResponseWriter, r *http.Request, tenantID string) error {
	if err := r.ParseForm(); err != nil {
		return &badRequest{fmt.Errorf("parse form: %w", err)}
	}
	selectors := r.Form["match[]"]
	if len(selectors) == 0 {
		return &badRequest{errors.New("no match[] parameter provided")}
	}
	for _, s := range selectors {
		if _, err := a.parser.ParseMetricSelector(s); err != nil {
			return &badRequest{fmt.Errorf("match[] %q: %w", s, err)}
		}
	}
	mint, err := adminTime(r.FormValue("start"), math.MinInt64)
	if err != nil {
		return &badRequest{fmt.Errorf("start: %w", err)}
	}
	maxt, err := adminTime(r.FormValue("end"), math.MaxInt64)
	if err != nil {
		return &badRequest{fmt.Errorf("end: %w", err)}
	}
	if mint > maxt {
		return &badRequest{errors.New("end timestamp must not be before start time")}
	}
	if err := a.opts.Admin.DeleteSeries(r.Context(), tenantID, selectors, mint, maxt); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) cleanTombstones(w http.ResponseWriter, r *http.Request, tenantID string) error {
	if err := a.opts.Admin.CleanTombstones(r.Context(), tenantID); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (a *API) snapshot(w http.ResponseWriter, r *http.Request, tenantID string) error {
	skipHead := false
	if v := r.FormValue("skip_head"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return &badRequest{fmt.Errorf("skip_head: %w", err)}
		}
		skipHead = b
	}
	name, err := a.opts.Admin.Snapshot(r.Context(), tenantID, skipHead)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v1.Response{Status: "success", Data: struct {
		Name string `json:"name"`
	}{name}})
	return nil
}

// adminTime parses a time as Prometheus' API takes it (Unix seconds with a
// fraction, or RFC 3339) into milliseconds; empty: def.
func adminTime(s string, def int64) (int64, error) {
	if s == "" {
		return def, nil
	}
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if math.IsNaN(f) || math.IsInf(f, 0) || math.Abs(f) > float64(math.MaxInt64)/1e3 {
			return 0, fmt.Errorf("%q out of range", s)
		}
		return int64(math.Round(f * 1e3)), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return 0, fmt.Errorf("cannot parse %q to a valid timestamp", s)
	}
	return t.UnixMilli(), nil
}
