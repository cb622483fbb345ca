package app

import (
	"context"
	"flag"
	"time"

	"github.com/grafana/dskit/modules"
	"github.com/grafana/dskit/services"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/query"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
	"github.com/gpustore/gpustore/pkg/storage/bucketstore"
	"github.com/gpustore/gpustore/pkg/storage/shipper"
)

// Object storage modules:
//
//	bucket ◀── shipper (also needs storage) ◀── ingest
//	       ◀── bucket-store ◀── query
//
// The shipper runs with the ingest role (targets all and ingest), the bucket
// store with the query role (targets all and query).
const (
	Bucket      = "bucket"
	Shipper     = "shipper"
	BucketStore = "bucket-store"
)

// registerObjstoreModules adds the object storage modules to the graph.
func (a *App) registerObjstoreModules() error {
	a.mm.RegisterModule(Bucket, a.initBucket, modules.UserInvisibleModule)
	a.mm.RegisterModule(Shipper, a.initShipper, modules.UserInvisibleModule)
	a.mm.RegisterModule(BucketStore, a.initBucketStore, modules.UserInvisibleModule)
	for mod, deps := range map[string][]string{
		Shipper:     {Storage, Bucket},
		BucketStore: {Bucket},
		Ingest:      {Shipper},
		Query:       {BucketStore},
	} {
		if err := a.mm.AddDependency(mod, deps...); err != nil {
			return err
		}
	}
	return nil
}

func (c *Config) validateObjstore() []error {
	var errs []error
	if err := c.Bucket.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.Shipper.Validate(); err != nil {
		errs = append(errs, err)
	}
	if err := c.BucketStore.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errs
}

func (c *Config) registerObjstoreFlags(fs *flag.FlagSet) {
	c.Bucket.RegisterFlags(fs)
	c.Shipper.RegisterFlags(fs)
	c.BucketStore.RegisterFlags(fs)
}

func (a *App) initBucket() (services.Service, error) {
	bkt, err := bucket.New(a.Cfg.Bucket, a.Cfg.TSDB.Dir, a.Logger.With("component", "bucket"), a.Registry)
	if err != nil {
		return nil, err
	}
	a.Bucket = bkt
	a.Logger.Info("bucket", "bucket", a.Cfg.Bucket.Describe(a.Cfg.TSDB.Dir))
	return services.NewIdleService(nil, func(error) error { return bkt.Close() }), nil
}

func (a *App) initShipper() (services.Service, error) {
	if !a.Cfg.Shipper.Enabled {
		return nil, nil
	}
	sh, err := shipper.New(a.Cfg.Shipper, a.Bucket, a.DBs, a.Logger.With("component", "shipper"), a.Registry)
	if err != nil {
		return nil, err
	}
	// Before storage starts: every tenant database opens with the gate.
	a.DBs.SetDeletionGate(sh.MayDelete)
	if a.Cfg.Ring.Enabled {
		// Queriers elsewhere see an upload at their next bucket listing.
		sh.KeepAfterUpload = 2 * time.Duration(a.Cfg.BucketStore.SyncInterval)
	}
	sh.OnUpload = func(tenant string, meta block.Meta) {
		if a.BucketStore != nil { // this process also serves queries: show the block at once
			if err := a.BucketStore.Add(meta); err != nil {
				a.Logger.Warn("add uploaded block to the bucket store", "tenant", tenant, "block", meta.ULID, "err", err)
			}
		}
	}
	a.Shipper = sh
	return services.NewBasicService(nil, sh.Run, nil), nil
}

func (a *App) initBucketStore() (services.Service, error) {
	st, err := bucketstore.New(a.Cfg.BucketStore, a.Bucket, a.Logger.With("component", "bucket-store"), a.Registry)
	if err != nil {
		return nil, err
	}
	st.SetBlockCache(a.seriesCache())
	a.BucketStore = st
	start := func(ctx context.Context) error {
		// A bucket that is down must not keep gpustore from starting (and
		// ingesting): the store keeps listing every sync interval.
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		if err := st.Sync(ctx); err != nil {
			a.Logger.Warn("initial bucket listing failed; bucket blocks appear once it succeeds", "err", err)
		}
		return nil
	}
	return services.NewBasicService(start, st.Run, nil), nil
}

// querySources are merged with each tenant's local TSDB by the query API.
func (a *App) querySources() []query.Source {
	if a.BucketStore == nil {
		return nil
	}
	return []query.Source{a.BucketStore}
}
