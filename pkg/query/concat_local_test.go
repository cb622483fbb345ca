package query

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/grafana/dskit/user"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/readopts"
	"github.com/gpustore/gpustore/pkg/tenantdb"
)

type oooLimits struct{ window time.Duration }

func (oooLimits) MaxActiveSeries(string) int              { return 0 }
func (oooLimits) MaxSeriesPerMetric(string) int           { return 0 }
func (oooLimits) MaxNewSeriesPerDay(string) int           { return 0 }
func (l oooLimits) OutOfOrderWindow(string) time.Duration { return l.window }

// TestBucketThenLocalReadInOrder: a receiver's bucket holds the hour
// before its local TSDB's first sample. A query over both reads each
// series as the bucket's part, then the local one (concatenated, not merged
// sample by sample: the engine's Seek at every step then moves through one
// part), every sample once and in order. An out-of-order sample appended
// locally into the bucket's hour makes the parts overlap: it is read, in
// its place.
func TestBucketThenLocalReadInOrder(t *testing.T) {
	ctx := context.Background()
	const t0 = int64(1_700_002_800_000) // a multiple of 2 h
	logger := slog.New(slog.DiscardHandler)
	series := []labels.Labels{
		labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "0"),
		labels.FromStrings("__name__", "DCGM_FI_DEV_GPU_TEMP", "gpu", "1"),
	}
	value := func(ts int64, i int) float64 { return float64(ts/scrapeEvery%89 + int64(i)) }

	// The bucket: [t0, t0+1h) as one block.
	dir := t.TempDir()
	w, err := tsdb.NewBlockWriter(logger, dir, 2*time.Hour.Milliseconds())
	if err != nil {
		t.Fatal(err)
	}
	app := w.Appender(ctx)
	for ts := t0; ts < t0+60*minute; ts += scrapeEvery {
		for i, ls := range series {
			if _, err := app.Append(0, ls, ts, value(ts, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := app.Commit(); err != nil {
		t.Fatal(err)
	}
	id, err := w.Flush(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_ = w.Close()
	bm, err := block.ReadLocalMeta(filepath.Join(dir, id.String()))
	if err != nil {
		t.Fatal(err)
	}
	bkt := objstore.NewInMemBucket()
	mustShip(t, ctx, bkt, filepath.Join(dir, id.String()), bm, "t")
	store := mustSyncedStore(t, ctx, bkt)

	// The local TSDB: [t0+1h, t0+2h) in its head, out-of-order samples
	// allowed 3 h back.
	cfg := tenantdb.DefaultConfig()
	cfg.Dir = t.TempDir()
	cfg.BlockDuration = model.Duration(2 * time.Hour)
	dbs, err := tenantdb.NewManager(cfg, logger, prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dbs.Close() })
	dbs.SetLimits(oooLimits{window: 3 * time.Hour})
	db, err := dbs.Get("t")
	if err != nil {
		t.Fatal(err)
	}
	lapp := db.Appender(ctx)
	for ts := t0 + 60*minute; ts < t0+120*minute; ts += scrapeEvery {
		for i, ls := range series {
			if _, err := lapp.Append(0, ls, ts, value(ts, i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := lapp.Commit(); err != nil {
		t.Fatal(err)
	}

	q := TenantQueryable{DBs: dbs, Sources: []Source{store}}
	actx := user.InjectOrgID(ctx, "t")
	read := func(wantIterator string) []string {
		t.Helper()
		// The merge underneath the query path's decoding (which would
		// hide the iterator that reads the parts).
		qr, err := q.openQuerier("t", t0, t0+120*minute, readopts.Default())
		if err != nil {
			t.Fatal(err)
		}
		defer qr.Close()
		hints := &storage.SelectHints{Start: t0, End: t0 + 120*minute, Step: 346_000}
		ss := qr.Select(actx, true, hints, labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_GPU_TEMP"))
		var out []string
		var it chunkenc.Iterator
		for ss.Next() {
			it = ss.At().Iterator(it)
			if got := fmt.Sprintf("%T", it); got != wantIterator {
				t.Errorf("%s read through %s, want %s", ss.At().Labels(), got, wantIterator)
			}
			last := int64(-1)
			n := 0
			for it.Next() != chunkenc.ValNone {
				ts, v := it.At()
				if ts <= last {
					t.Fatalf("%s: sample at %d after %d", ss.At().Labels(), ts, last)
				}
				last = ts
				n++
				if ts%scrapeEvery != 0 {
					out = append(out, fmt.Sprintf("%s %d %v", ss.At().Labels(), ts, v))
				}
			}
			out = append(out, fmt.Sprintf("%s: %d samples", ss.At().Labels(), n))
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
		}
		if err := ss.Err(); err != nil {
			t.Fatal(err)
		}
		return out
	}
	perSeries := int(120 * minute / scrapeEvery)
	want := fmt.Sprint([]string{
		fmt.Sprintf("%s: %d samples", series[0], perSeries),
		fmt.Sprintf("%s: %d samples", series[1], perSeries),
	})
	if got := fmt.Sprint(read("*seriesset.concatIterator")); got != want {
		t.Fatalf("bucket then local: got %s, want %s", got, want)
	}

	// An out-of-order sample in the bucket's hour, between two scrapes.
	lapp = db.Appender(ctx)
	ooo := t0 + 30*minute + 7_000
	if _, err := lapp.Append(0, series[1], ooo, -1); err != nil {
		t.Fatal(err)
	}
	if err := lapp.Commit(); err != nil {
		t.Fatal(err)
	}
	want = fmt.Sprint([]string{
		fmt.Sprintf("%s: %d samples", series[0], perSeries),
		fmt.Sprintf("%s %d -1", series[1], ooo),
		fmt.Sprintf("%s: %d samples", series[1], perSeries+1),
	})
	// The parts overlap now: merged sample by sample.
	got := read("*seriesset.chainIterator")
	if fmt.Sprint(got) != want {
		t.Fatalf("with an out-of-order local sample: got %s, want %s", got, want)
	}
}
