package tenantdb

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/fileutil"
	"github.com/prometheus/prometheus/tsdb/wlog"
	"github.com/prometheus/prometheus/util/compression"
)

// Recovering a crashed head beside a fresh one.
//
// After a kill -9 (OOM kill, node loss) the TSDB replays the tenant's WAL
// before the open returns: ≈ 0.42 µs per sample and 9–14 µs per series
// inside Prometheus' replay loop, 10–13 minutes on two cores for a receiver
// of 4 M series killed before its 3 h cut (bench/RESULTS.md, "WAL replay
// taken apart"), all of it before the receiver is ready. No setting of the
// TSDB makes that loop faster, and a periodic chunk snapshot cannot be made
// crash-consistent from outside it (the head's m-mapped chunks wait in a
// write buffer the snapshot would rely on).
//
// So with recovery aside on, an open that would replay at least
// RecoverAsideMinWALBytes moves the crashed head's files (WAL, out-of-order
// WBL, m-mapped head chunks, chunk snapshots) into Dir/recover.<n> and opens
// the tenant with an empty head at once: the receiver is ready and takes
// writes in seconds. In the background the set-aside head is opened as a
// TSDB of its own (the replay), written into blocks, and those blocks are
// moved into the tenant's directory, where its database loads them at its
// next block reload and the shipper uploads them. Nothing is deleted before
// the blocks holding it are on disk, and every step is safe to interrupt:
// the next open finishes what the last one started.
//
// Until a recovery ends, this receiver's answers lack the crashed head's
// samples (Manager.Recovering). In a ring at RF ≥ 2 it refuses reads of the
// tenant meanwhile and a read quorum of the other replicas answers, which
// holds every acknowledged sample (pkg/ringread): that is why "auto" turns
// it on only there. The set-aside head and the new one are both in memory
// during the recovery: size for it (docs/operating.md).

// recoverDirPrefix names a set-aside head; with recoverTmpSuffix it is one
// whose files were still being moved (undone at the next open).
const (
	recoverDirPrefix = "recover."
	recoverTmpSuffix = ".tmp"
)

// headFiles are the tenant directory's entries that make up its head.
func headFiles(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		switch n := e.Name(); {
		case n == "wal", n == "wbl", n == "chunks_head", strings.HasPrefix(n, "chunk_snapshot."):
			out = append(out, n)
		}
	}
	return out, nil
}

// walBytesToReplay is what opening dir would replay of its WAL: the
// segments after the last chunk snapshot (from its offset) and the last
// checkpoint unless the snapshot is newer, as the TSDB's head.Init does.
func walBytesToReplay(dir string) (int64, error) {
	walDir := filepath.Join(dir, "wal")
	if _, err := os.Stat(walDir); errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	snapIdx, snapOffset := -1, 0
	if _, idx, off, err := tsdb.LastChunkSnapshot(dir); err == nil {
		snapIdx, snapOffset = idx, off
	}
	var total int64
	from := snapIdx
	if cp, idx, err := wlog.LastCheckpoint(walDir); err == nil && idx >= snapIdx {
		n, err := fileutil.DirSize(cp)
		if err != nil {
			return 0, err
		}
		total += n
		from = idx + 1
	}
	first, last, err := wlog.Segments(walDir)
	if err != nil {
		return 0, err
	}
	for i := max(first, from); i <= last && last >= 0; i++ {
		fi, err := os.Stat(wlog.SegmentName(walDir, i))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, err
		}
		n := fi.Size()
		if i == snapIdx {
			n -= int64(snapOffset)
		}
		total += max(n, 0)
	}
	return total, nil
}

// undoInterruptedSetAside moves back the files of a set-aside that a crash
// interrupted (a recover.<n>.tmp directory): the head is whole again.
func undoInterruptedSetAside(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), recoverDirPrefix) || !strings.HasSuffix(e.Name(), recoverTmpSuffix) {
			continue
		}
		tmp := filepath.Join(dir, e.Name())
		moved, err := os.ReadDir(tmp)
		if err != nil {
			return err
		}
		for _, f := range moved {
			if err := os.Rename(filepath.Join(tmp, f.Name()), filepath.Join(dir, f.Name())); err != nil {
				return fmt.Errorf("move %s back from an interrupted set-aside: %w", f.Name(), err)
			}
		}
		if err := os.Remove(tmp); err != nil {
			return err
		}
	}
	return nil
}

// setHeadAside moves dir's head into a new recover.<n> directory when
// opening it would replay at least minBytes of WAL; it returns the
// directory, or "" when the head stays. The files move into a .tmp
// directory renamed once all are in, so that a crash in between leaves
// either the head in place or a whole set-aside head.
func setHeadAside(dir string, minBytes int64) (string, int64, error) {
	n, err := walBytesToReplay(dir)
	if err != nil || n < max(minBytes, 1) {
		return "", n, err
	}
	files, err := headFiles(dir)
	if err != nil {
		return "", n, err
	}
	aside := filepath.Join(dir, recoverDirPrefix+strconv.FormatInt(time.Now().UnixNano(), 10))
	tmp := aside + recoverTmpSuffix
	if err := os.Mkdir(tmp, 0o777); err != nil {
		return "", n, err
	}
	for _, f := range files {
		if err := os.Rename(filepath.Join(dir, f), filepath.Join(tmp, f)); err != nil {
			return "", n, errors.Join(fmt.Errorf("set %s aside: %w", f, err), undoInterruptedSetAside(dir))
		}
	}
	if err := fileutil.Replace(tmp, aside); err != nil {
		return "", n, errors.Join(err, undoInterruptedSetAside(dir))
	}
	return aside, n, nil
}

// setAsideHeads lists dir's set-aside heads, oldest first.
func setAsideHeads(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if e.IsDir() && strings.HasPrefix(e.Name(), recoverDirPrefix) && !strings.HasSuffix(e.Name(), recoverTmpSuffix) {
			out = append(out, filepath.Join(dir, e.Name()))
		}
	}
	slices.Sort(out) // recover.<unix nanoseconds>: the same width for centuries
	return out, nil
}

// writeAsideBlocks replays a set-aside head (opened as a TSDB of its own
// with opts) and writes it into blocks in the same directory, then removes
// its WAL and head files: what they held is in the blocks, on disk.
func writeAsideBlocks(ctx context.Context, aside string, opts *tsdb.Options, l *slog.Logger) error {
	db, err := tsdb.Open(aside, l, nil, opts, nil)
	if err != nil {
		return fmt.Errorf("open set-aside head: %w", err)
	}
	db.DisableCompactions() // the blocks are written here, not by its loop
	err = flushHead(ctx, db, opts.MinBlockDuration)
	if cerr := db.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("close set-aside head: %w", cerr)
	}
	if err != nil {
		return err
	}
	files, err := headFiles(aside)
	if err != nil {
		return err
	}
	for _, f := range files {
		if err := os.RemoveAll(filepath.Join(aside, f)); err != nil {
			return err
		}
	}
	return nil
}

// adoptBlocks moves the blocks written in a set-aside head's directory into
// the tenant's and removes the directory; it returns the blocks moved.
func adoptBlocks(aside, dir string) ([]ulid.ULID, error) {
	entries, err := os.ReadDir(aside)
	if err != nil {
		return nil, err
	}
	var moved []ulid.ULID
	for _, e := range entries {
		id, err := ulid.ParseStrict(e.Name())
		if err != nil || !e.IsDir() {
			continue
		}
		if _, err := os.Stat(filepath.Join(aside, e.Name(), "meta.json")); err != nil {
			continue // a block the TSDB had not finished: it removes such
		}
		if err := os.Rename(filepath.Join(aside, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			return moved, err
		}
		moved = append(moved, id)
	}
	// The renames are durable before the set-aside directory (its WAL gone
	// already) is removed.
	df, err := fileutil.OpenDir(dir)
	if err != nil {
		return moved, err
	}
	err = errors.Join(df.Sync(), df.Close())
	if err != nil {
		return moved, err
	}
	return moved, os.RemoveAll(aside)
}

// recoveries runs the set-aside heads' recoveries one at a time, across
// tenants: each holds a crashed head in memory beside the tenant's new one.
type recoveries struct {
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	one    sync.Mutex

	mtx     sync.Mutex
	pending map[string]int // set-aside heads not recovered yet, by tenant

	pendingHeads prometheus.Gauge
	failed       prometheus.Counter
	duration     prometheus.Histogram
}

func newRecoveries(reg prometheus.Registerer) *recoveries {
	ctx, cancel := context.WithCancel(context.Background())
	r := &recoveries{
		ctx: ctx, cancel: cancel, pending: map[string]int{},
		pendingHeads: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "gpustore_tsdb_head_recoveries_pending",
			Help: "Crashed heads set aside at open and not yet written into blocks the database reads (a failed recovery's stay until a restart): until 0, this receiver refuses reads of their tenants.",
		}),
		failed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "gpustore_tsdb_head_recovery_failures_total",
			Help: "Recoveries of a set-aside head that failed; the head stays set aside and the next start tries again.",
		}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "gpustore_tsdb_head_recovery_duration_seconds",
			Help:    "Time from a set-aside head's open to its blocks being in the tenant's directory.",
			Buckets: prometheus.ExponentialBuckets(1, 2, 12),
		}),
	}
	if reg != nil {
		reg.MustRegister(r.pendingHeads, r.failed, r.duration)
	}
	return r
}

// start recovers the tenant's set-aside heads in the background.
func (r *recoveries) start(db *tsdb.DB, tenantID, dir string, heads []string, opts *tsdb.Options, l *slog.Logger) {
	if len(heads) == 0 {
		return
	}
	r.pendingHeads.Add(float64(len(heads)))
	r.mtx.Lock()
	r.pending[tenantID] += len(heads)
	r.mtx.Unlock()
	done := func() {
		r.pendingHeads.Dec()
		r.mtx.Lock()
		defer r.mtx.Unlock()
		if r.pending[tenantID]--; r.pending[tenantID] <= 0 {
			delete(r.pending, tenantID)
		}
	}
	r.wg.Go(func() {
		r.one.Lock()
		defer r.one.Unlock()
		for _, aside := range heads {
			if r.ctx.Err() != nil {
				return // stopping: the next start recovers the rest
			}
			start := time.Now()
			l.Info("recovering a set-aside head into blocks", "dir", aside)
			err := writeAsideBlocks(r.ctx, aside, opts, l.With("recovering", filepath.Base(aside)))
			var blocks []ulid.ULID
			if err == nil {
				blocks, err = adoptBlocks(aside, dir)
			}
			if err == nil {
				// The database loads the adopted blocks at its next
				// reload: until then the tenant still counts as
				// recovering, so that reads keep going to its replicas.
				r.waitLoaded(db, blocks, 2*opts.BlockReloadInterval+5*time.Second)
			}
			if err != nil && r.ctx.Err() != nil {
				l.Info("stopped recovering a set-aside head; the next start resumes it", "dir", aside)
				return
			}
			if err != nil {
				// Still pending: the tenant's answers here keep lacking
				// the head's samples, so its reads stay refused and its
				// replicas answer, until a restart recovers it.
				r.failed.Inc()
				l.Error("recovering a set-aside head failed; the next start tries again", "dir", aside, "err", err)
				continue
			}
			done()
			r.duration.Observe(time.Since(start).Seconds())
			l.Info("recovered a set-aside head", "blocks", len(blocks), "duration", time.Since(start))
		}
	})
}

// waitLoaded waits until db has loaded the blocks, or for at most max (a
// block retention deleted at once never shows).
func (r *recoveries) waitLoaded(db *tsdb.DB, ids []ulid.ULID, max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) && r.ctx.Err() == nil {
		loaded := map[ulid.ULID]bool{}
		for _, b := range db.Blocks() {
			loaded[b.Meta().ULID] = true
		}
		if !slices.ContainsFunc(ids, func(id ulid.ULID) bool { return !loaded[id] }) {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// recovering reports whether the tenant has a set-aside head not yet
// recovered: its database's answers lack that head's samples.
func (r *recoveries) recovering(tenantID string) bool {
	r.mtx.Lock()
	defer r.mtx.Unlock()
	return r.pending[tenantID] > 0
}

// stop cancels the recoveries between their steps and waits for them: an
// open in progress (the replay) is not interruptible and runs to its end.
func (r *recoveries) stop() {
	r.cancel()
	r.wg.Wait()
}

// Recovering reports whether the tenant has a crashed head set aside and not
// yet recovered into blocks the database reads (recover.go): until then its
// answers lack that head's samples, and a ring's reads ask its replicas.
func (m *Manager) Recovering(tenantID string) bool { return m.recoveries.recovering(tenantID) }

// setAside runs before a tenant's open: it undoes an interrupted set-aside,
// sets the head aside when RecoverWALAside is on and its replay would be
// long, and returns the tenant's set-aside heads, to recover after the open.
func (m *Manager) setAside(tenantID, dir string) ([]string, error) {
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil, nil // a new tenant
	}
	if err := undoInterruptedSetAside(dir); err != nil {
		return nil, fmt.Errorf("undo an interrupted set-aside of tenant %q: %w", tenantID, err)
	}
	if m.cfg.RecoverWALAside == "on" {
		aside, n, err := setHeadAside(dir, m.cfg.RecoverAsideMinWALBytes)
		if err != nil {
			return nil, fmt.Errorf("set the head of tenant %q aside: %w", tenantID, err)
		}
		if aside != "" {
			m.logger.Warn("the head's WAL is long to replay (a crash, or a stop without snapshot): set aside to recover into blocks after the open", "tenant", tenantID, "wal_bytes", n, "dir", aside)
		}
	}
	return setAsideHeads(dir)
}

// asideOptions open a set-aside head: the tenant's block range and
// out-of-order window (its WBL replays), a chunk snapshot loaded if a
// clean stop left one, and none of the live database's callbacks, limits,
// retention or exemplars (the blocks it becomes hold none).
func (m *Manager) asideOptions(oooWindow int64) *tsdb.Options {
	o := tsdb.DefaultOptions()
	o.MinBlockDuration = m.cfg.BlockDuration.Milliseconds()
	o.MaxBlockDuration = o.MinBlockDuration
	o.RetentionDuration = 0
	o.OutOfOrderTimeWindow = oooWindow
	o.EnableOverlappingCompaction = false
	o.EnableExemplarStorage = false
	o.MaxExemplars = 0
	o.StripeSize = cmp.Or(m.cfg.StripeSize, defaultStripeSize)
	o.EnableMemorySnapshotOnShutdown = true
	o.BlockReloadInterval = m.cfg.blockReloadInterval()
	if m.cfg.WALCompression {
		o.WALCompression = compression.Snappy
	}
	return o
}
