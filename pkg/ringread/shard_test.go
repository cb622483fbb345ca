package ringread

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/grafana/dskit/kv"
	"github.com/grafana/dskit/ring"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpustore/gpustore/pkg/tenancy"
)

// addToRingAt registers a receiver, ACTIVE, with n tokens spread over the
// ring and the given registration time.
func addToRingAt(tb testing.TB, store kv.Client, id, addr string, i, of int, registered time.Time) {
	tb.Helper()
	tokens := make([]uint32, 0, 32)
	for j := range 32 {
		tokens = append(tokens, uint32(j*of+i)*(math.MaxUint32/uint32(32*of))+1)
	}
	err := store.CAS(context.Background(), "receiver", func(in any) (any, bool, error) {
		d, _ := in.(*ring.Desc)
		if d == nil {
			d = ring.NewDesc()
		}
		d.AddIngester(id, addr, "", tokens, ring.ACTIVE, registered, false, time.Time{}, nil)
		return d, true, nil
	})
	if err != nil {
		tb.Fatal(err)
	}
}

func ids(insts []ring.InstanceDesc) []string {
	out := make([]string, 0, len(insts))
	for _, in := range insts {
		out = append(out, in.Id)
	}
	slices.Sort(out)
	return out
}

// TestShuffleShardReads: a tenant with a shuffle shard is read from the
// receivers of its shard alone, and answers whole; after its shard shrank,
// the receivers the shrink dropped are read as long as the change is within
// the lookback (they hold its recent samples), and no longer after; a
// receiver that joined within the lookback is read beside the shard it
// changed (dskit's ShuffleShardWithLookback).
func TestShuffleShardReads(t *testing.T) {
	const lookback = time.Hour
	rg, store := startRing(t, 3)
	var rs []*receiver
	for i := range 6 {
		r := newReceiver(t, fmt.Sprintf("r%d", i), tenancy.DefaultConfig())
		rs = append(rs, r)
		addToRingAt(t, store, r.id, r.addr(), i, 6, time.Now().Add(-2*lookback))
	}
	waitRing(t, rg, 6)
	byID := map[string]*receiver{}
	for _, r := range rs {
		byID[r.id] = r
	}
	shardOf := func(tenant string, size int) []string {
		all, err := rg.ShuffleShard(tenant, size).GetAllHealthy(ring.Read)
		if err != nil {
			t.Fatal(err)
		}
		return ids(all.Instances)
	}
	small, large := shardOf("team-a", 3), shardOf("team-a", 5)
	// team-a's series as its writes left them: every sample of gpu_util
	// on its three replicas of the shard of 3 (the shard is RF); gpu_temp
	// written while the shard was 5, on two of its replicas, both outside
	// the shard of 3.
	one := func(int) float64 { return 1 }
	for _, id := range small {
		byID[id].write(t, "team-a", `gpu_util{gpu="0",host="a"}`, steps(0, nSteps-1), one)
	}
	var dropped []string
	for _, id := range large {
		if !slices.Contains(small, id) {
			dropped = append(dropped, id)
			byID[id].write(t, "team-a", `gpu_temp{gpu="3",host="b"}`, steps(0, nSteps-1), func(int) float64 { return 70 })
		}
	}
	if len(dropped) != 2 {
		t.Fatalf("shard of 5 %v minus shard of 3 %v: %v, want 2 receivers (shards nest)", large, small, dropped)
	}

	var mtx sync.Mutex
	shrunk := time.Now() // team-a went from 5 to 3 receivers then
	sizeSince := func(tenant string, since time.Time) int {
		mtx.Lock()
		defer mtx.Unlock()
		if tenant == "team-a" && since.Before(shrunk) {
			return 5
		}
		if tenant == "team-a" {
			return 3
		}
		return 0
	}
	src, err := NewSource(SourceConfig{Timeout: 10 * time.Second, ShardSize: sizeSince, ShardLookback: lookback}, rg, quiet, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	asked := func() []string {
		var out []string
		for _, r := range rs {
			if n := r.answered()["chunked"]; n > 0 {
				out = append(out, r.id)
			}
		}
		return out
	}
	asked() // reset

	wantBoth := want(map[string]func(int) (float64, bool){
		`gpu_util{gpu="0",host="a"}`: constant(1),
		`gpu_temp{gpu="3",host="b"}`: constant(70),
	})
	got, _, err := dump(context.Background(), src, "team-a", all)
	if err != nil {
		t.Fatal(err)
	}
	if got != wantBoth {
		t.Errorf("within the lookback of the shrink:\ngot\n%swant\n%s", got, wantBoth)
	}
	for _, id := range asked() {
		if !slices.Contains(large, id) {
			t.Errorf("receiver %s, outside team-a's shards %v, was read", id, large)
		}
	}

	// The shrink is older than the lookback: the shard of 3 alone.
	mtx.Lock()
	shrunk = time.Now().Add(-2 * lookback)
	mtx.Unlock()
	got, _, err = dump(context.Background(), src, "team-a", all)
	if err != nil {
		t.Fatal(err)
	}
	wantUtil := want(map[string]func(int) (float64, bool){`gpu_util{gpu="0",host="a"}`: constant(1)})
	if got != wantUtil {
		t.Errorf("after the lookback, the shard of 3:\ngot\n%swant\n%s", got, wantUtil)
	}
	if a := asked(); len(a) == 0 || slices.ContainsFunc(a, func(id string) bool { return !slices.Contains(small, id) }) {
		t.Errorf("read %v, want receivers of team-a's shard %v only", a, small)
	}

	// A tenant without a shard is read from a read quorum of the whole ring.
	if _, _, err := dump(context.Background(), src, "team-b", all); err != nil {
		t.Fatal(err)
	}
	if a := asked(); len(a) != 5 {
		t.Errorf("team-b (no shard) read from %v, want 5 of the 6 receivers", a)
	}

	// A receiver joining now may take team-a's shard: the receivers it
	// displaced are read still.
	r6 := newReceiver(t, "r6", tenancy.DefaultConfig())
	addToRingAt(t, store, r6.id, r6.addr(), 6, 7, time.Now())
	waitRing(t, rg, 7)
	read, err := src.ringOf("team-a").GetAllHealthy(ring.Read)
	if err != nil {
		t.Fatal(err)
	}
	got6 := ids(read.Instances)
	for _, id := range small {
		if !slices.Contains(got6, id) {
			t.Errorf("after r6 joined, team-a is read from %v, which lacks %s of its shard before", got6, id)
		}
	}
	if now := shardOf("team-a", 3); slices.Contains(now, "r6") && !slices.Contains(got6, "r6") {
		t.Errorf("r6 is in team-a's shard %v but not read (%v)", now, got6)
	}
}
