package queryfrontend

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// TestAnswersAreCompressed: Grafana asks for gzip. An answer the frontend
// joins from day pieces and one Prometheus' API writes (one piece) both come
// back gzipped, and decompress to exactly the bytes of the plain answer; a
// small answer (under 1 KiB) comes back plain.
func TestAnswersAreCompressed(t *testing.T) {
	s := newStack(t, 3, nil)
	plain := &http.Client{Transport: &http.Transport{DisableCompression: true}}
	fetch := func(srv *httptest.Server, q string, start time.Time, step time.Duration, encoding string) (*http.Response, []byte) {
		t.Helper()
		form := rangeForm(q, start, s.now, step)
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/v1/query_range", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if encoding != "" {
			req.Header.Set("Accept-Encoding", encoding)
		}
		resp, err := plain.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", q, resp.StatusCode, body)
		}
		return resp, body
	}
	for _, c := range []struct {
		name  string
		srv   *httptest.Server
		q     string
		start time.Time
		step  time.Duration
		gzip  bool
	}{
		{"joined by the frontend", s.front, "gpu_util", s.now.Add(-48 * time.Hour), 10 * time.Minute, true},
		{"written by the API", s.direct, "gpu_util", s.now.Add(-48 * time.Hour), 10 * time.Minute, true},
		{"one piece through the frontend", s.front, "gpu_util", s.now.Add(-time.Hour), time.Minute, true},
		{"small", s.front, "count(gpu_util)", s.now.Add(-5 * time.Minute), time.Minute, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			resp, want := fetch(c.srv, c.q, c.start, c.step, "")
			if enc := resp.Header.Get("Content-Encoding"); enc != "" {
				t.Fatalf("asked for no encoding, got %q", enc)
			}
			resp, got := fetch(c.srv, c.q, c.start, c.step, "gzip")
			if enc := resp.Header.Get("Content-Encoding"); (enc == "gzip") != c.gzip {
				t.Fatalf("Content-Encoding %q for a %d-byte answer, want gzip: %v", enc, len(want), c.gzip)
			}
			if c.gzip {
				zr, err := gzip.NewReader(bytes.NewReader(got))
				if err != nil {
					t.Fatal(err)
				}
				if got, err = io.ReadAll(zr); err != nil {
					t.Fatal(err)
				}
			}
			if !bytes.Equal(got, want) {
				t.Fatalf("answers differ:\ngzip  %.300s\nplain %.300s", got, want)
			}
		})
	}
}
