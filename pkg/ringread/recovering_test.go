package ringread

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/util/annotations"

	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/tenancy"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

// recoveringReceiver is r0 of newCluster restarted after a kill -9 with
// its crashed head set aside (tenantdb's recover_wal_aside): it holds r0's
// samples in a head it is still recovering, and its database reads none
// of them. With 2 h blocks the recovered blocks load at the database's
// first reload, a minute after the open: the reads below run before.
func recoveringReceiver(t *testing.T) *receiver {
	t.Helper()
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.RecoverWALAside, cfg.RecoverAsideMinWALBytes = "on", 1
	crashed, err := tenantdb.NewManager(cfg, quiet, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = crashed.Close() })
	r := &receiver{dbs: crashed}
	r.write(t, "team-a", `gpu_util{gpu="0",host="a"}`, steps(0, nSteps-1), func(int) float64 { return 1 })
	r.write(t, "team-a", `gpu_util{gpu="1",host="a"}`, steps(0, 9), func(i int) float64 { return 10 + float64(i) })

	// What a kill -9 leaves: the WAL's records are in the files.
	cfg.Dir = t.TempDir()
	if err := os.CopyFS(filepath.Join(cfg.Dir, "tenants"), os.DirFS(filepath.Join(crashed.Config().Dir, "tenants"))); err != nil {
		t.Fatal(err)
	}
	dbs, err := tenantdb.NewManager(cfg, quiet, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dbs.Close() })
	if err := dbs.OpenExisting(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !dbs.Recovering("team-a") {
		t.Fatal("the restarted receiver is not recovering a set-aside head")
	}
	return newReceiverOn(t, "r0", tenancy.DefaultConfig(), dbs)
}

// TestRecoveringReceiverIsReadAround: a receiver recovering its crashed
// head refuses reads of the tenant (503), so a read quorum is made of the
// other replicas, which hold every sample between them; counted as an
// answer, its empty one would leave out the samples only it and one other
// replica had (gpu_util{gpu="1"} steps 0–4 and 5–9, whenever it is picked).
// The same holds when it is the querying process's own receiver (Self),
// which is then asked rather than counted as answered.
func TestRecoveringReceiverIsReadAround(t *testing.T) {
	c := newCluster(t)
	r0 := recoveringReceiver(t)
	rg := newRing(t, 3, r0, c.rs[1], c.rs[2])
	check := func(what string, read func() (string, annotations.Annotations, error)) {
		t.Helper()
		for range 12 {
			got, ws, err := read()
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if got != wantTeamA {
				t.Fatalf("%s: the answer lacks samples of the recovering receiver's replicas:\n%s\nwant:\n%s", what, got, wantTeamA)
			}
			for _, w := range ws.AsErrors() {
				if !strings.Contains(w.Error(), "receiver r0") || !strings.Contains(w.Error(), "recovering a crashed head") {
					t.Errorf("%s: warning %v, want only r0's refusal", what, w)
				}
			}
		}
		if !r0.dbs.Recovering("team-a") {
			t.Fatalf("%s: r0's recovery ended during the reads: the test proves nothing", what)
		}
	}

	src, _ := newSource(t, rg, "")
	check("a query process", func() (string, annotations.Annotations, error) {
		return dump(context.Background(), src, "team-a", all)
	})

	self, err := NewSource(SourceConfig{Self: "r0", SelfRecovering: r0.dbs.Recovering, Timeout: 10 * time.Second}, rg, quiet, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	qa := query.TenantQueryable{DBs: r0.dbs, Receivers: self, ReceiversLookback: time.Hour}
	check("r0's own query role", func() (string, annotations.Annotations, error) {
		q, err := qa.Querier(ts(0), ts(nSteps-1))
		if err != nil {
			return "", nil, err
		}
		defer q.Close()
		return dumpSet(q.Select(user.InjectOrgID(context.Background(), "team-a"), true, nil, all))
	})
}
