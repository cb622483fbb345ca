package ringread

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/prometheus/promql"

	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

type oooLimits struct{}

func (oooLimits) MaxActiveSeries(string) int            { return 0 }
func (oooLimits) OutOfOrderWindow(string) time.Duration { return 2 * time.Hour }
func (oooLimits) MaxSeriesPerMetric(string) int         { return 0 }
func (oooLimits) MaxNewSeriesPerDay(string) int         { return 0 }

// TestRingReadsOutOfOrderLikeSingleNode: receivers that took samples out
// of order (a replica overtaken by the next write, a late sender) hold
// them in blocks of their own that overlap in-order blocks, and in their
// out-of-order head; they send those chunks as stored, overlapping
// (tenantdb.DB.ChunkQuerierUnmerged), and the query process merges them
// with the replicas' into the single node's answers, for random queries.
func TestRingReadsOutOfOrderLikeSingleNode(t *testing.T) {
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 42))
	ctx := context.Background()
	const tenant = "team-a"
	single := newBlockManager(t, t.TempDir())
	single.SetLimits(oooLimits{})
	rs := make([]*receiver, 3)
	for i := range rs {
		rs[i] = newShippingReceiver(t, fmt.Sprintf("r%d", i))
		rs[i].dbs.SetLimits(oooLimits{})
	}
	rg, _ := newSpreadRing(t, rs...)
	series := dcgmSeries()
	const steps = 160
	t0 := time.Now().Add(-time.Duration(steps+20) * 15 * time.Second).Truncate(time.Minute).UnixMilli()
	// write appends the sample of each series at ts to the single node and
	// to a write quorum of the receivers (each missing a sample now and then).
	write := func(ts int64, step int, delta float64) {
		for _, s := range series {
			v, ok := s.value(step)
			if !ok {
				continue
			}
			appendOne(t, single, tenant, s.lset, ts, v+delta)
			skip := -1
			if rng.IntN(20) == 0 {
				skip = rng.IntN(len(rs))
			}
			for i, r := range rs {
				if i != skip {
					appendOne(t, r.dbs, tenant, s.lset, ts, v+delta)
				}
			}
		}
	}
	for step := 0; step < steps; step += 2 { // in order, every 30 s
		write(t0+int64(step)*15_000, step, 0)
	}
	for _, m := range append([]*tenantdb.Manager{single}, rs[0].dbs, rs[1].dbs, rs[2].dbs) {
		if err := m.Existing(tenant).Compact(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Out of order in between, into hours in blocks: some compacted into
	// blocks of their own, the rest left in the out-of-order head.
	for step := 1; step < steps/2; step += 2 {
		write(t0+int64(step)*15_000, step, 0.25)
	}
	for _, m := range append([]*tenantdb.Manager{single}, rs[0].dbs, rs[1].dbs, rs[2].dbs) {
		if err := m.Existing(tenant).CompactOOOHead(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for step := steps/2 + 1; step < steps; step += 4 {
		write(t0+int64(step)*15_000, step, 0.5)
	}
	src, _ := newSource(t, rg, "")
	front := query.TenantQueryable{DBs: newManager(t), Receivers: src, ReceiversLookback: 24 * time.Hour}
	ref := query.TenantQueryable{DBs: single}
	engine := promql.NewEngine(promql.EngineOpts{MaxSamples: 5e7, Timeout: time.Minute, LookbackDelta: 5 * time.Minute})
	qctx := user.InjectOrgID(ctx, tenant)
	end := t0 + steps*15_000
	for range 60 {
		q := newRandomQuery(rng, t0, end)
		if got, want := q.run(t, qctx, engine, front), q.run(t, qctx, engine, ref); got != want {
			t.Fatalf("%s differs from the single node's\nring:\n%s\nsingle node:\n%s", q, got, want)
		}
	}
	overlapping := 0
	for _, r := range rs {
		for _, b := range r.dbs.Existing(tenant).Blocks() {
			if m := b.Meta(); m.Compaction.FromOutOfOrder() {
				overlapping++
			}
		}
	}
	if overlapping == 0 {
		t.Error("no receiver holds a block of out-of-order samples")
	}
}
