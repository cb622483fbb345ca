package tenancy

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/gpustore/gpustore/pkg/auth"
)

// TestAuthorisation: with tenants.auth, the identity decides which tenants a
// request may name (403 for others), an identity with one tenant needs no
// header, an unknown or missing identity is refused, and "*" allows every
// tenant and the process-wide routes.
func TestAuthorisation(t *testing.T) {
	c := Config{DefaultTenant: "default", Auth: map[string][]string{
		"prometheus-a": {"team-a"},
		"grafana":      {"team-a", "team-b"},
		"ops":          {AnyTenant},
	}}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, identity, header string
		want                   string
		status                 int
	}{
		{"single tenant, no header", "prometheus-a", "", "team-a", 0},
		{"single tenant, own header", "prometheus-a", "team-a", "team-a", 0},
		{"single tenant, other tenant", "prometheus-a", "team-b", "", http.StatusForbidden},
		{"single tenant, default tenant", "prometheus-a", "default", "", http.StatusForbidden},
		{"two tenants, header", "grafana", "team-b", "team-b", 0},
		{"two tenants, no header", "grafana", "", "", http.StatusBadRequest},
		{"two tenants, other", "grafana", "team-c", "", http.StatusForbidden},
		{"any tenant", "ops", "team-z", "team-z", 0},
		{"any tenant, no header: the default", "ops", "", "default", 0},
		{"unknown identity", "mallory", "team-a", "", http.StatusForbidden},
		{"no identity", "", "team-a", "", http.StatusUnauthorized},
		{"invalid tenant", "ops", "../x", "", http.StatusBadRequest},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			if tc.identity != "" {
				r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{User: tc.identity}))
			}
			if tc.header != "" {
				r.Header.Set(OrgIDHeader, tc.header)
			}
			got, err := c.FromRequest(r)
			if tc.status == 0 {
				if err != nil || got != tc.want {
					t.Fatalf("got %q, %v; want %q", got, err, tc.want)
				}
				return
			}
			var te *Error
			if !errors.As(err, &te) || te.Status != tc.status {
				t.Fatalf("got %q, %v; want status %d", got, err, tc.status)
			}
		})
	}
	// The THANOS-TENANT header is held to the same rule.
	r := httptest.NewRequest(http.MethodGet, "/", nil)
	r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{User: "prometheus-a"}))
	r.Header.Set(ThanosTenantHeader, "team-b")
	if _, err := c.FromRequest(r); err == nil {
		t.Error("THANOS-TENANT: team-b allowed for prometheus-a")
	}
	// A certificate's common name is an identity too.
	r = httptest.NewRequest(http.MethodGet, "/", nil)
	r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{CommonName: "prometheus-a"}))
	if got, err := c.FromRequest(r); err != nil || got != "team-a" {
		t.Errorf("by certificate CN: %q, %v", got, err)
	}

	for who, want := range map[string]bool{"ops": true, "grafana": false, "prometheus-a": false, "": false} {
		r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
		if who != "" {
			r = r.WithContext(auth.WithIdentity(r.Context(), auth.Identity{User: who}))
		}
		if got := c.Admin(r) == nil; got != want {
			t.Errorf("Admin(%q) = %v, want %v", who, got, want)
		}
	}
	// Without tenants.auth every request may use the process-wide routes.
	if err := (Config{}).Admin(httptest.NewRequest(http.MethodGet, "/metrics", nil)); err != nil {
		t.Errorf("no tenants.auth: %v", err)
	}
}

func TestAuthValidate(t *testing.T) {
	for name, c := range map[string]Config{
		"no tenants":     {Auth: map[string][]string{"a": {}}},
		"invalid tenant": {Auth: map[string][]string{"a": {"../x"}}},
		"empty identity": {Auth: map[string][]string{"": {"a"}}},
	} {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: valid", name)
		}
	}
}
