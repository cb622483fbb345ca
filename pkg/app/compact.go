package app

import (
	"github.com/grafana/dskit/services"

	"github.com/gpustore/gpustore/internal/resources"
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
	return services.NewBasicService(c.Start, c.Run, nil), nil
}
