package query

import (
	"bytes"
	"encoding/json"
	"net/http"
	"path"
	"strconv"
	"strings"
)

// hideRuleFiles keeps where rule files lie on the server (the rules
// directory, the layout of every tenant's folder) from the /api/v1/rules
// answers of identities that are not allowed every tenant, when tenants
// are authenticated: a group's file is shown as its name in the tenant's
// rules folder. The embedded pack's names (embedded:gpu-pack/...) are no
// path and stay. Operators (identities allowed "*") and the single-user
// default (no tenants.auth) see the paths, as in Prometheus.
func (a *API) hideRuleFiles(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !strings.HasSuffix(r.URL.Path, "/api/v1/rules") || len(a.opts.Tenants.Auth) == 0 || a.opts.Tenants.Admin(r) == nil {
			next.ServeHTTP(w, r)
			return
		}
		ans := &bufferedAnswer{header: w.Header(), status: http.StatusOK}
		next.ServeHTTP(ans, r)
		body := ans.body.Bytes()
		if ans.status == http.StatusOK {
			if short, err := shortenRuleFiles(body); err == nil {
				body = short
			} else {
				// Never show what could not be rewritten.
				writeError(w, http.StatusInternalServerError, "internal", err)
				return
			}
		}
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
		w.WriteHeader(ans.status)
		_, _ = w.Write(body)
	})
}

// ruleFileName is what an identity of one tenant is shown of a rule file.
func ruleFileName(file string) string {
	if strings.HasPrefix(file, "embedded:") {
		return file
	}
	return path.Base(strings.ReplaceAll(file, `\`, "/"))
}

// shortenRuleFiles rewrites the file of every group of a /api/v1/rules
// answer (Prometheus' envelope: data.groups[].file), leaving every other
// field as it was.
func shortenRuleFiles(body []byte) ([]byte, error) {
	var env map[string]json.RawMessage
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, err
	}
	var data map[string]json.RawMessage
	if err := json.Unmarshal(env["data"], &data); err != nil {
		return nil, err
	}
	var groups []map[string]json.RawMessage
	if g, ok := data["groups"]; !ok {
		return body, nil
	} else if err := json.Unmarshal(g, &groups); err != nil {
		return nil, err
	}
	for _, g := range groups {
		var file string
		if err := json.Unmarshal(g["file"], &file); err != nil {
			return nil, err
		}
		g["file"], _ = json.Marshal(ruleFileName(file))
	}
	var err error
	if data["groups"], err = json.Marshal(groups); err != nil {
		return nil, err
	}
	if env["data"], err = json.Marshal(data); err != nil {
		return nil, err
	}
	return json.Marshal(env)
}

// bufferedAnswer holds an answer back so that it can be rewritten: the
// headers are the real writer's, status and body are kept.
type bufferedAnswer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedAnswer) Header() http.Header         { return b.header }
func (b *bufferedAnswer) WriteHeader(status int)      { b.status = status }
func (b *bufferedAnswer) Write(p []byte) (int, error) { return b.body.Write(p) }
