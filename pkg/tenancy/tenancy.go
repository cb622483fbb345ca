// Package tenancy resolves which tenant an HTTP request belongs to.
//
// gpustore reads the tenant from X-Scope-OrgID (what Mimir, Cortex and Loki
// users send) or THANOS-TENANT (what Thanos users send), falling back to a
// configured default tenant so a plain Prometheus needs no header at all.
// Tenant IDs are validated with dskit's rules, the same Mimir applies, so a
// tenant ID is always safe as a directory name.
package tenancy

import (
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/grafana/dskit/tenant"
)

// Header names a tenant may arrive in, in order of precedence.
const (
	OrgIDHeader        = "X-Scope-OrgID"
	ThanosTenantHeader = "THANOS-TENANT"
)

// Config says how requests map to tenants.
type Config struct {
	// DefaultTenant serves requests that name no tenant.
	DefaultTenant string `yaml:"default_tenant"`
	// Allowed, when not empty, is the closed list of tenants; others are refused.
	Allowed []string `yaml:"allowed"`
}

// DefaultConfig returns the embedded default: one tenant, "default".
func DefaultConfig() Config { return Config{DefaultTenant: "default"} }

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.DefaultTenant != "" {
		if err := tenant.ValidTenantID(c.DefaultTenant); err != nil {
			return fmt.Errorf("default tenant %q: %w", c.DefaultTenant, err)
		}
	}
	for _, t := range c.Allowed {
		if err := tenant.ValidTenantID(t); err != nil {
			return fmt.Errorf("allowed tenant %q: %w", t, err)
		}
	}
	return nil
}

// Error says why a request has no usable tenant, with the HTTP status to answer.
type Error struct {
	Status int
	Err    error
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// FromRequest returns the request's tenant.
func (c Config) FromRequest(r *http.Request) (string, error) {
	id := r.Header.Get(OrgIDHeader)
	if id == "" {
		id = r.Header.Get(ThanosTenantHeader)
	}
	if id == "" {
		id = c.DefaultTenant
	}
	if id == "" {
		return "", &Error{http.StatusUnauthorized, errors.New("no tenant: set the X-Scope-OrgID header")}
	}
	if err := tenant.ValidTenantID(id); err != nil {
		return "", &Error{http.StatusBadRequest, fmt.Errorf("invalid tenant %q: %w", id, err)}
	}
	if len(c.Allowed) > 0 && !slices.Contains(c.Allowed, id) {
		return "", &Error{http.StatusUnauthorized, fmt.Errorf("unknown tenant %q", id)}
	}
	return id, nil
}
