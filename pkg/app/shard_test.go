package app

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/grafana/dskit/kv/consul"
	"github.com/grafana/dskit/ring"
	"github.com/grafana/dskit/services"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/pkg/limits"
	"github.com/gpustore/gpustore/pkg/receiverring"
)

// A receiver's share of a tenant's max_active_series counts the receivers
// that hold the tenant: those of its shuffle shard when it has one (each of
// a shard of RF receivers holds every one of its series), else every
// receiver of the ring.
func TestStorageLimitsShareOverTheShard(t *testing.T) {
	logger := slog.New(slog.DiscardHandler)
	store, closer := consul.NewInMemoryClient(ring.GetCodec(), logging.GoKit(logger), nil)
	t.Cleanup(func() { _ = closer.Close() })
	desc := ring.NewDesc()
	gen := ring.NewRandomTokenGenerator()
	for i := range 6 {
		id := fmt.Sprintf("r%d", i)
		desc.AddIngester(id, id+":9201", "", gen.GenerateTokens(16, desc.GetTokens()), ring.ACTIVE, time.Now(), false, time.Time{}, nil)
	}
	if err := store.CAS(context.Background(), receiverring.Key, func(any) (any, bool, error) { return desc, true, nil }); err != nil {
		t.Fatal(err)
	}
	rg, err := ring.NewWithStoreClientAndStrategy(ring.Config{HeartbeatTimeout: time.Hour, ReplicationFactor: 3},
		receiverring.Name, receiverring.Key, store, ring.NewDefaultReplicationStrategy(), prometheus.NewRegistry(), logging.GoKit(logger))
	if err != nil {
		t.Fatal(err)
	}
	if err := services.StartAndAwaitRunning(context.Background(), rg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = services.StopAndAwaitTerminated(context.Background(), rg) })
	for rg.InstancesWithTokensCount() != 6 {
		time.Sleep(time.Millisecond)
	}
	for _, c := range []struct {
		shard, want int
	}{
		{0, 500}, // 3/6 of 1000
		{3, 1000},
		{2, 1000}, // raised to RF
		{4, 750},
		{10, 500}, // more than the ring: the ring
	} {
		lcfg := limits.DefaultConfig()
		lcfg.Defaults.MaxActiveSeries = 1000
		lcfg.Defaults.IngestionShardSize = c.shard
		lim, err := limits.New(lcfg, logger, prometheus.NewRegistry())
		if err != nil {
			t.Fatal(err)
		}
		a := &App{Cfg: DefaultConfig(), Limits: lim, Ring: rg, Logger: logger}
		a.Cfg.Ring.Enabled = true
		a.Cfg.Ring.ReplicationFactor = 3
		if got := a.storageLimits().MaxActiveSeries("t"); got != c.want {
			t.Errorf("shard %d of 6 receivers: %d series per receiver, want %d", c.shard, got, c.want)
		}
	}
}
