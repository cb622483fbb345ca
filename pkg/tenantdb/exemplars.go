package tenantdb

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/prometheus/prometheus/model/exemplar"
	"github.com/prometheus/prometheus/model/histogram"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
)

// exemplarsMarker, in a tenant's directory, says that the tenant has sent
// exemplars: its ring buffer is allocated when it opens, so that the
// exemplars in its WAL are replayed into it.
const exemplarsMarker = "exemplars-on"

// exemplarRing sizes a tenant's exemplar ring buffer: empty until the
// tenant's first exemplar, then tsdb.max_exemplars entries. The TSDB
// allocates the whole buffer up front (~7 MB at the default 100,000), which
// made every tenant, also one that never sends an exemplar (no GPU exporter
// does), cost that much.
type exemplarRing struct {
	max    int64  // the configured size; 0: exemplars off
	marker string // path of the tenant's exemplarsMarker
	on     atomic.Bool
	mtx    sync.Mutex   // serialises turning on
	grow   func() error // applies the size to the TSDB (Manager.applyLimits)
}

// load reads whether the tenant has sent exemplars before.
func (r *exemplarRing) load() {
	if _, err := os.Stat(r.marker); err == nil && r.max > 0 {
		r.on.Store(true)
	}
}

// size is the ring buffer's size now.
func (r *exemplarRing) size() int64 {
	if r.on.Load() {
		return r.max
	}
	return 0
}

// turnOn allocates the ring buffer, once; the marker is written first, so
// that a crash after the first exemplars still replays them.
func (r *exemplarRing) turnOn() error {
	if r.max <= 0 || r.on.Load() {
		return nil
	}
	r.mtx.Lock()
	defer r.mtx.Unlock()
	if r.on.Load() {
		return nil
	}
	if err := os.WriteFile(r.marker, nil, 0o644); err != nil {
		return fmt.Errorf("mark exemplars on: %w", err)
	}
	r.on.Store(true)
	if err := r.grow(); err != nil {
		r.on.Store(false)
		return errors.Join(err, os.Remove(r.marker))
	}
	return nil
}

// AppenderV2 is the TSDB's, which turns the exemplar buffer on at the
// first exemplar while it is off.
func (db *DB) AppenderV2(ctx context.Context) storage.AppenderV2 {
	app := db.DB.AppenderV2(ctx)
	if db.exemplars.max <= 0 || db.exemplars.on.Load() {
		return app
	}
	return &exemplarsOnV2{AppenderV2: app, db: db}
}

// Appender is the TSDB's, which turns the exemplar buffer on at the first
// exemplar while it is off.
func (db *DB) Appender(ctx context.Context) storage.Appender {
	app := db.DB.Appender(ctx)
	if db.exemplars.max <= 0 || db.exemplars.on.Load() {
		return app
	}
	return &exemplarsOnV1{Appender: app, db: db}
}

type exemplarsOnV2 struct {
	storage.AppenderV2
	db *DB
}

func (a *exemplarsOnV2) Append(ref storage.SeriesRef, ls labels.Labels, st, t int64, v float64, h *histogram.Histogram, fh *histogram.FloatHistogram, opts storage.AOptions) (storage.SeriesRef, error) {
	if len(opts.Exemplars) > 0 {
		if err := a.db.exemplars.turnOn(); err != nil {
			a.db.logger.Warn("exemplar storage could not be turned on; the exemplars are dropped", "err", err)
		}
	}
	return a.AppenderV2.Append(ref, ls, st, t, v, h, fh, opts)
}

// AppendExemplars is the TSDB appender's (storage.ExemplarAppenderV2, how
// the ingest appends a series' exemplars after its samples).
func (a *exemplarsOnV2) AppendExemplars(ref storage.SeriesRef, ls labels.Labels, es []exemplar.Exemplar) (storage.SeriesRef, error) {
	ea, ok := a.AppenderV2.(storage.ExemplarAppenderV2)
	if !ok {
		return 0, errors.New("the TSDB's appender takes no exemplars")
	}
	if len(es) > 0 {
		if err := a.db.exemplars.turnOn(); err != nil {
			a.db.logger.Warn("exemplar storage could not be turned on; the exemplars are dropped", "err", err)
		}
	}
	return ea.AppendExemplars(ref, ls, es)
}

type exemplarsOnV1 struct {
	storage.Appender
	db *DB
}

func (a *exemplarsOnV1) AppendExemplar(ref storage.SeriesRef, ls labels.Labels, e exemplar.Exemplar) (storage.SeriesRef, error) {
	if err := a.db.exemplars.turnOn(); err != nil {
		a.db.logger.Warn("exemplar storage could not be turned on; the exemplars are dropped", "err", err)
	}
	return a.Appender.AppendExemplar(ref, ls, e)
}
