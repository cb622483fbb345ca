// Package receivers is the read side of scale-out (issue 15): every receiver
// serves its own tenants' recent data over Prometheus' remote-read protocol
// (ReadHandler), and a query process reads all receivers of the ring as one
// query.Source (Source), merging the replicas of each series.
package receivers

import (
	"errors"
	"log/slog"
	"net/http"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/storage/remote"

	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// ReadPath is where a receiver answers remote-read requests for its own data.
const ReadPath = "/receiver/read"

// Limits of the read handler. Prometheus' defaults for its own
// /api/v1/read: a query process asks each receiver once per selector, so ten
// concurrent reads are several concurrent queries; frames of about 1 MiB
// keep memory per stream bounded; the sample limit applies only to the
// SAMPLES response type (label calls ask for series without samples).
const (
	readConcurrency     = 10
	readMaxBytesInFrame = 1 << 20
	readSampleLimit     = 5e7
)

// ReadHandler answers Prometheus remote-read requests (streamed XOR chunks,
// or samples for clients that ask for them) with the requesting tenant's
// data held by this receiver: its head and local blocks only, never the
// bucket's blocks, which the querying process reads itself.
//
// The tenant comes from the request as for writes (tenancy.FromRequest:
// X-Scope-OrgID, THANOS-TENANT, the identity's single tenant, the default
// tenant) and is put into the request's context, where TenantQueryable
// finds it.
func ReadHandler(dbs *tenantdb.Manager, tenants tenancy.Config, logger *slog.Logger, reg prometheus.Registerer) http.Handler {
	return readHandler(query.TenantQueryable{DBs: dbs}, tenants, logger, reg)
}

// readHandler is ReadHandler over any queryable. The body is read before
// the request waits for one of the readConcurrency slots, so a request
// whose client (a querier that timed out) has gone is cancelled at once
// (query.ReadWholeBody).
func readHandler(q storage.SampleAndChunkQueryable, tenants tenancy.Config, logger *slog.Logger, reg prometheus.Registerer) http.Handler {
	// Prometheus' query API (pkg/query) registers the same read-handler
	// metrics on the process's registry: prefixed, both fit in one process.
	if reg != nil {
		reg = prometheus.WrapRegistererWithPrefix("gpustore_receiver_", reg)
	}
	h := remote.NewReadHandler(logger, reg, q,
		// No external labels: series are stored with their own labels only.
		func() config.Config { return config.Config{} },
		readSampleLimit, readConcurrency, readMaxBytesInFrame)
	return query.ReadWholeBody(query.MaxReadRequestBytes, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if id, ok := requestTenant(w, r, tenants); ok {
			h.ServeHTTP(w, r.WithContext(user.InjectOrgID(r.Context(), id)))
		}
	}))
}

// requestTenant returns the request's tenant (tenancy.FromRequest), or
// answers the request with the reason there is none.
func requestTenant(w http.ResponseWriter, r *http.Request, tenants tenancy.Config) (string, bool) {
	id, err := tenants.FromRequest(r)
	if err != nil {
		status := http.StatusBadRequest
		if te, ok := errors.AsType[*tenancy.Error](err); ok {
			status = te.Status
		}
		http.Error(w, err.Error(), status)
		return "", false
	}
	return id, true
}
