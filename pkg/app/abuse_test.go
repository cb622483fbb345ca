package app

import (
	"flag"
	"net/http"
	"testing"
	"time"

	"github.com/gpustore/gpustore/internal/abuse"
)

// TestThousandAbandonedRemoteReads: a thousand remote reads (/api/v1/read)
// whose clients leave without reading the answer leave gpustore with the
// goroutines and open files it had within seconds, and it goes on taking
// writes and answering reads. Before, remote read was registered with a
// concurrency limit of 0: no read ever ran, and each one held a goroutine
// and a file descriptor for good (300 of them under a 256-file limit
// stopped writes and /-/healthy).
func TestThousandAbandonedRemoteReads(t *testing.T) {
	cfg, _, err := Load(flag.NewFlagSet("gpustore", flag.ContinueOnError), []string{
		"-storage.tsdb.path=" + t.TempDir(), "-web.listen-address=127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	a := startApp(t, cfg)
	addr := a.Server.Addr().String()
	base := "http://" + addr
	now := time.Now().UnixMilli()
	if code := postWrite(t, base, `DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="node-1"}`, now-15_000, 97); code != http.StatusNoContent {
		t.Fatalf("write: %d", code)
	}
	http.DefaultClient.CloseIdleConnections()
	before, err := abuse.Measure()
	if err != nil {
		t.Fatal(err)
	}
	if err := abuse.AbandonedReads(addr, "/api/v1/read", abuse.ReadRequest("DCGM_FI_DEV_GPU_UTIL", now-60_000, now+1), nil, 1000); err != nil {
		t.Fatal(err)
	}
	if err := abuse.SettlesTo(before, 20, 10*time.Second); err != nil {
		t.Fatalf("1000 abandoned remote reads later: %v", err)
	}
	if code := postWrite(t, base, `DCGM_FI_DEV_GPU_UTIL{gpu="0",Hostname="node-1"}`, now, 98); code != http.StatusNoContent {
		t.Errorf("write after the abandoned reads: %d", code)
	}
	if got := instantValue(t, base, `DCGM_FI_DEV_GPU_UTIL`); got != "98" {
		t.Errorf("query after the abandoned reads: %q, want 98", got)
	}
}
