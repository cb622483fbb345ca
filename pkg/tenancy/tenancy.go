// Package tenancy resolves which tenant an HTTP request belongs to, and
// whether the request's authenticated identity may act for it.
//
// gpustore reads the tenant from X-Scope-OrgID (what Mimir, Cortex and Loki
// users send) or THANOS-TENANT (what Thanos users send), falling back to a
// configured default tenant so a plain Prometheus needs no header at all.
// Tenant IDs are validated with dskit's rules, the same Mimir applies, so a
// tenant ID is always safe as a directory name.
//
// With tenants.auth set, a header alone no longer chooses the tenant: the
// identity the web configuration authenticated (pkg/auth: a basic-auth user
// or a verified client certificate's common name) must be allowed the tenant,
// or the answer is 403. An identity allowed exactly one tenant needs no
// header at all, so Prometheus' remote_write and Grafana's data source work
// with only their basic_auth or tls_config.
package tenancy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	"github.com/grafana/dskit/tenant"

	"github.com/gpustore/gpustore/pkg/auth"
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
	// Auth, when not empty, maps each authenticated identity (basic-auth
	// user, client certificate common name) to the tenants it may write and
	// read; AnyTenant ("*") allows every tenant and the process-wide routes
	// (/metrics, /-/reload, /ha-tracker). Identities not listed get 403.
	Auth map[string][]string `yaml:"auth"`
}

// AnyTenant in a tenants.auth list allows every tenant.
const AnyTenant = "*"

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
	for who, ts := range c.Auth {
		if who == "" {
			return errors.New("tenants.auth: empty identity")
		}
		if len(ts) == 0 {
			return fmt.Errorf("tenants.auth: identity %q has no tenants", who)
		}
		for _, t := range ts {
			if t == AnyTenant {
				continue
			}
			if err := tenant.ValidTenantID(t); err != nil {
				return fmt.Errorf("tenants.auth: tenant %q of %q: %w", t, who, err)
			}
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

// FromRequest returns the request's tenant. A request of another gpustore
// process of the ring (AsPeer) names its tenant in the header, which is
// taken as it is: the process that sent it resolved and authorised the
// user's tenant.
func (c Config) FromRequest(r *http.Request) (string, error) {
	id := r.Header.Get(OrgIDHeader)
	if id == "" {
		id = r.Header.Get(ThanosTenantHeader)
	}
	var allowed []string
	if len(c.Auth) > 0 && !isPeer(r.Context()) {
		var err error
		if allowed, err = c.identityTenants(r); err != nil {
			return "", err
		}
		if id == "" && len(allowed) == 1 && allowed[0] != AnyTenant {
			id = allowed[0] // the identity's single tenant
		}
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
	if allowed != nil && !slices.Contains(allowed, AnyTenant) && !slices.Contains(allowed, id) {
		if r.Header.Get(OrgIDHeader) == "" && r.Header.Get(ThanosTenantHeader) == "" {
			return "", &Error{http.StatusBadRequest, fmt.Errorf("no tenant: the identity may use several tenants (%v); set the X-Scope-OrgID header", allowed)}
		}
		return "", &Error{http.StatusForbidden, fmt.Errorf("tenant %q is not allowed for this identity", id)}
	}
	return id, nil
}

// identityTenants returns the tenants the request's identity may use.
func (c Config) identityTenants(r *http.Request) ([]string, error) {
	who, ok := auth.IdentityFrom(r.Context())
	if !ok {
		return nil, &Error{http.StatusUnauthorized, errors.New("tenants.auth is set: authenticate with basic auth or a client certificate")}
	}
	allowed, ok := c.Auth[who.Name()]
	if !ok {
		return nil, &Error{http.StatusForbidden, fmt.Errorf("identity %q may use no tenant", who.Name())}
	}
	return allowed, nil
}

// Admin says whether the request may use process-wide routes, which show or
// change more than one tenant: always without tenants.auth, else only for an
// identity allowed every tenant.
func (c Config) Admin(r *http.Request) error {
	if len(c.Auth) == 0 {
		return nil
	}
	allowed, err := c.identityTenants(r)
	if err != nil {
		return err
	}
	if !slices.Contains(allowed, AnyTenant) {
		return &Error{http.StatusForbidden, errors.New("this route shows every tenant: it needs an identity allowed \"*\" in tenants.auth")}
	}
	return nil
}

// Peer says whether the request comes from another gpustore process of the
// ring, which alone may use the receivers' internal routes (/receiver/*:
// writes that skip the distributors' limits and HA election, every
// tenant's reads). peers are ring.peer_identities: with them, only those
// identities are peers; without them, identities allowed every tenant
// ("*"), never a tenant's own, and anyone when tenants.auth is not set.
func (c Config) Peer(r *http.Request, peers []string) error {
	if len(peers) == 0 {
		if err := c.Admin(r); err != nil {
			if te, ok := errors.AsType[*Error](err); ok && te.Status == http.StatusUnauthorized {
				return err
			}
			return &Error{http.StatusForbidden, errors.New("this route is internal to the ring: it needs an identity allowed \"*\" in tenants.auth, or one of ring.peer_identities when set")}
		}
		return nil
	}
	who, ok := auth.IdentityFrom(r.Context())
	if !ok {
		return &Error{http.StatusUnauthorized, errors.New("this route is internal to the ring: authenticate as one of ring.peer_identities")}
	}
	if !slices.Contains(peers, who.Name()) {
		return &Error{http.StatusForbidden, fmt.Errorf("this route is internal to the ring: identity %q is not one of ring.peer_identities", who.Name())}
	}
	return nil
}

type peerKey struct{}

// AsPeer marks ctx as a request of another process of the ring that Peer
// let in.
func AsPeer(ctx context.Context) context.Context { return context.WithValue(ctx, peerKey{}, true) }

func isPeer(ctx context.Context) bool { return ctx.Value(peerKey{}) != nil }
