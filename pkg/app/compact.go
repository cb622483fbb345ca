package app

import (
	"path/filepath"
	"time"

	"github.com/grafana/dskit/services"

	"github.com/gpustore/gpustore/internal/resources"
	"github.com/gpustore/gpustore/pkg/blockupload"
	"github.com/gpustore/gpustore/pkg/compact"
)

// Compact is the compactor role: server, overrides, bucket ◀── compact.
// It needs no local TSDB, so -target=compact runs on its own beside
// receivers and queriers that share the bucket.
const Compact = "compact"

func (a *App) registerCompactModule() error {
	a.mm.RegisterModule(Compact, a.initCompact)
	for _, d := range [][2]string{{Compact, Server}, {Compact, Overrides}, {Compact, Bucket}, {All, Compact}} {
		if err := a.mm.AddDependency(d[0], d[1]); err != nil {
			return err
		}
	}
	return nil
}

func (a *App) initCompact() (services.Service, error) {
	c, err := compact.New(a.Cfg.Compact, a.Bucket, a.Cfg.TSDB.Dir, a.Limits, a.Logger.With("component", "compact"), a.Registry)
	if err != nil {
		return nil, err
	}
	a.Compactor = c
	a.volumes.Add(resources.Volume{Name: "compact", Dir: c.Dir()})
	// Mimir's block-upload API (mimirtool backfill) lives with the
	// compactor, as in Mimir: it writes into the bucket the compactor
	// merges, and needs nothing else.
	ranges := make([]int64, len(a.Cfg.Compact.BlockRanges))
	for i, r := range a.Cfg.Compact.BlockRanges {
		ranges[i] = time.Duration(r).Milliseconds()
	}
	upload := blockupload.NewAPI(blockupload.APIConfig{Ranges: ranges, WorkDir: filepath.Join(a.Cfg.TSDB.Dir, "block-upload"), MaxValidations: 2},
		a.Bucket, a.Cfg.Tenant, a.Logger.With("component", "block-upload"))
	upload.Register(a.Server.Mux)
	return services.NewBasicService(c.Start, c.Run, func(error) error { upload.Stop(); return nil }), nil
}
