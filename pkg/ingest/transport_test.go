package ingest

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/prometheus/prompb"
)

// cutBody sends a write whose body stops after half its bytes: the
// connection then stalls (until the server's read deadline) or, with
// halfClose, the client closes its sending side. It returns the answer.
func cutBody(t *testing.T, addr string, body []byte, halfClose bool) *http.Response {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "POST /api/v1/write HTTP/1.1\r\nHost: x\r\nContent-Type: %s\r\nContent-Encoding: snappy\r\nContent-Length: %d\r\n\r\n", ctV1, len(body))
	if _, err := c.Write(body[:len(body)/2]); err != nil {
		t.Fatal(err)
	}
	if halfClose {
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("no answer to a cut body: %v", err)
	}
	resp.Body.Close()
	return resp
}

// TestCutBodyIsRetried: a body that stops arriving (the server's read
// timeout cuts it) or ends before its Content-Length is a transport failure,
// not bad data: it is answered 503 with Retry-After, which Prometheus
// retries, where a 400 would make it drop the batch. A body that arrives
// whole but is not snappy stays a 400.
func TestCutBodyIsRetried(t *testing.T) {
	ti := newTestIngester(t)
	srv := httptest.NewUnstartedServer(ti)
	srv.Config.ReadTimeout = 300 * time.Millisecond
	srv.Start()
	t.Cleanup(srv.Close)
	addr := srv.Listener.Addr().String()
	body := encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
		v1Series([]prompb.Sample{{Timestamp: nowMs(), Value: 1}}, "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0", "Hostname", "node-1"),
	}})

	for _, c := range []struct {
		name      string
		halfClose bool
	}{{"stalled past the read timeout", false}, {"ended before its Content-Length", true}} {
		t.Run(c.name, func(t *testing.T) {
			resp := cutBody(t, addr, body, c.halfClose)
			if resp.StatusCode != http.StatusServiceUnavailable {
				t.Fatalf("status %d, want 503 (Prometheus drops a batch answered 400)", resp.StatusCode)
			}
			if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || s <= 0 {
				t.Errorf("Retry-After %q", resp.Header.Get("Retry-After"))
			}
		})
	}
	if got := ti.stored(t, "default"); len(got) != 0 {
		t.Errorf("stored from cut bodies: %v", got)
	}

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/v1/write", strings.NewReader("whole, but not snappy"))
	req.Header.Set("Content-Type", ctV1)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a whole body that is not snappy: %d, want 400", resp.StatusCode)
	}
}

// slotsBusy is what pkg/server's body reads at its end when the tenant's
// write slots are all taken (server.WriteSlotsBusyError).
type slotsBusy struct{}

func (slotsBusy) Error() string {
	return "tenant \"default\" has 2 writes in progress (server.max_concurrent_writes_per_tenant)"
}
func (slotsBusy) HTTPStatus() int { return http.StatusServiceUnavailable }

// refusingBody reads body and then, in place of its end, err.
type refusingBody struct {
	r   *bytes.Reader
	err error
}

func (b *refusingBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, b.err
	}
	return n, err
}

// TestWriteSlotRefusalIsAnsweredAsSuch: a body whose end reads the server's
// refusal of a write slot is answered with the refusal's status (503),
// Retry-After and its message, for remote write and for OTLP (as a
// google.rpc.Status), not as a body cut off.
func TestWriteSlotRefusalIsAnsweredAsSuch(t *testing.T) {
	ti := newTestIngester(t)
	body := encodeV1(t, &prompb.WriteRequest{Timeseries: []prompb.TimeSeries{
		v1Series([]prompb.Sample{{Timestamp: nowMs(), Value: 1}}, "__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0"),
	}})
	req := httptest.NewRequest(http.MethodPost, "/api/v1/write", io.NopCloser(&refusingBody{bytes.NewReader(body), slotsBusy{}}))
	req.Header.Set("Content-Type", ctV1)
	rec := httptest.NewRecorder()
	ti.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || !strings.Contains(rec.Body.String(), "max_concurrent_writes_per_tenant") {
		t.Errorf("remote write: %d, Retry-After %q: %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
	mux := http.NewServeMux()
	ti.RegisterRoutes(mux)
	req = httptest.NewRequest(http.MethodPost, "/otlp/v1/metrics", io.NopCloser(&refusingBody{bytes.NewReader(otlpBody(t, gpuMetrics(time.Now(), 60, 1), false)), slotsBusy{}}))
	req.Header.Set("Content-Type", otlpProtobuf)
	rec = httptest.NewRecorder()
	mux.ServeHTTP(rec, req)
	r := response{rec.Code, rec.Body.String(), rec.Header()}
	if s := otlpStatus(t, r); r.code != http.StatusServiceUnavailable || r.header.Get("Retry-After") == "" || s.Code != 14 || !strings.Contains(s.Message, "max_concurrent_writes_per_tenant") {
		t.Errorf("OTLP: %d, Retry-After %q: %v", r.code, r.header.Get("Retry-After"), s)
	}
	if got := ti.stored(t, "default"); len(got) != 0 {
		t.Errorf("stored %v", got)
	}
}
