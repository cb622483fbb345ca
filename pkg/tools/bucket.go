package tools

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/grafana/dskit/tenant"
	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/blockupload"
	"github.com/gpustore/gpustore/pkg/compact"
	"github.com/gpustore/gpustore/pkg/downsample"
	"github.com/gpustore/gpustore/pkg/rewrite"
	"github.com/gpustore/gpustore/pkg/storage/bucket"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

// bucketFlags are the flags every bucket command has.
type bucketFlags struct {
	objstoreFile string
	tenant       string
	output       string
}

func (b *bucketFlags) register(fs *flag.FlagSet, tenantRequired bool) {
	fs.StringVar(&b.objstoreFile, "objstore.config-file", "", "YAML file of the bucket (type: S3|FILESYSTEM, config: ..., prefix: ...), as gpustore's --objstore.config-file and Thanos take it. Required.")
	what := "Tenant whose blocks to work on."
	if tenantRequired {
		what += " Required."
	} else {
		what += " Empty: every tenant."
	}
	fs.StringVar(&b.tenant, "tenant", "", what)
}

func (b *bucketFlags) registerOutput(fs *flag.FlagSet) {
	fs.StringVar(&b.output, "output", "text", "text (a table) or json (one object per line).")
}

// open opens the bucket; the tenant is checked when required.
func (b *bucketFlags) open(tenantRequired bool) (objstore.Bucket, error) {
	if b.objstoreFile == "" {
		return nil, usageError("--objstore.config-file is required")
	}
	if tenantRequired && b.tenant == "" {
		return nil, usageError("--tenant is required")
	}
	if b.tenant != "" {
		if err := tenant.ValidTenantID(b.tenant); err != nil {
			return nil, usageError("--tenant %q: %v", b.tenant, err)
		}
	}
	if b.output != "" && b.output != "text" && b.output != "json" {
		return nil, usageError("--output %q: want text or json", b.output)
	}
	cfg, err := bucket.Config{ConfigFile: b.objstoreFile}.Resolved()
	if err != nil {
		return nil, err
	}
	if strings.EqualFold(cfg.Type, bucket.Filesystem) {
		if d, _ := cfg.Config["directory"].(string); d == "" {
			return nil, fmt.Errorf("%s: a FILESYSTEM bucket needs config.directory here (gpustore's default is <storage.tsdb.path>/bucket)", b.objstoreFile)
		}
	}
	return bucket.New(cfg, "", slog.New(slog.DiscardHandler), nil)
}

// tenants lists the bucket's tenants, or the one asked for.
func (b *bucketFlags) tenants(ctx context.Context, bkt objstore.Bucket) ([]string, error) {
	if b.tenant != "" {
		return []string{b.tenant}, nil
	}
	var out []string
	err := bkt.Iter(ctx, "", func(name string) error {
		if t, ok := strings.CutSuffix(name, "/"); ok && tenant.ValidTenantID(t) == nil && t != "~tmp" {
			out = append(out, t)
		}
		return nil
	})
	slices.Sort(out)
	return out, err
}

func bucketCommands() []*Command {
	return []*Command{lsCommand(), inspectCommand(), verifyCommand(), markCommand(), rewriteCommand(), uploadCommand()}
}

// blockRow is a block as ls and inspect show it.
type blockRow struct {
	Tenant  string               `json:"tenant"`
	Meta    *block.Meta          `json:"meta"`
	Del     *block.DeletionMark  `json:"deletion_mark,omitempty"`
	NC      *block.NoCompactMark `json:"no_compact_mark,omitempty"`
	Partial bool                 `json:"partial,omitempty"`
	ID      ulid.ULID            `json:"ulid"`
}

// readTenant lists a tenant's blocks (complete, marked, partial, corrupted)
// from one listing: bucketindex.Update reads every meta.json and mark.
func readTenant(ctx context.Context, bkt objstore.Bucket, t string) ([]blockRow, *bucketindex.Index, error) {
	x, err := bucketindex.Update(ctx, bkt, t, nil)
	if err != nil {
		return nil, nil, err
	}
	del, nc := x.DeletionMarkMap(), x.NoCompactMarkMap()
	var rows []blockRow
	for _, m := range x.Blocks {
		rows = append(rows, blockRow{Tenant: t, ID: m.ULID, Meta: m, Del: del[m.ULID], NC: nc[m.ULID]})
	}
	for _, id := range x.Partial {
		rows = append(rows, blockRow{Tenant: t, ID: id, Partial: true})
	}
	for _, id := range x.Corrupted {
		rows = append(rows, blockRow{Tenant: t, ID: id, Partial: true})
	}
	slices.SortFunc(rows, func(a, b blockRow) int {
		am, bm := int64(0), int64(0)
		if a.Meta != nil {
			am = a.Meta.MinTime
		}
		if b.Meta != nil {
			bm = b.Meta.MinTime
		}
		return cmp.Or(cmp.Compare(am, bm), a.ID.Compare(b.ID))
	})
	return rows, x, nil
}

func fmtTime(ms int64) string { return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05Z") }

func fmtDur(ms int64) string {
	d := time.Duration(ms) * time.Millisecond
	if d%(24*time.Hour) == 0 {
		return fmt.Sprintf("%dd", d/(24*time.Hour))
	}
	if d%time.Hour == 0 {
		return fmt.Sprintf("%dh", d/time.Hour)
	}
	return d.String()
}

func marks(r blockRow) string {
	var m []string
	if r.Del != nil {
		m = append(m, fmt.Sprintf("deletion (%s, %s)", time.Unix(r.Del.DeletionTime, 0).UTC().Format(time.RFC3339), r.Del.Details))
	}
	if r.NC != nil {
		m = append(m, fmt.Sprintf("no-compact (%s: %s)", r.NC.Reason, r.NC.Details))
	}
	return strings.Join(m, "; ")
}

func lsCommand() *Command {
	return &Command{
		Name:    "ls",
		Summary: "list the blocks of a tenant (or of every tenant): time range, resolution, level, source, marks",
		Doc: "Reads the tenant's listing and every `meta.json` and mark (not the bucket index, which may be a pass old). " +
			"A block without `meta.json` is listed as `partial`: an upload in progress or cut short, which readers never read and the compactor deletes once `compact.partial_delete_delay` old.",
		Flags: func(fs *flag.FlagSet, env *Env) func([]string) error {
			var bf bucketFlags
			bf.register(fs, false)
			bf.registerOutput(fs)
			return func(args []string) error {
				if len(args) > 0 {
					return usageError("unexpected argument %q", args[0])
				}
				bkt, err := bf.open(false)
				if err != nil {
					return err
				}
				defer bkt.Close()
				ctx := context.Background()
				ts, err := bf.tenants(ctx, bkt)
				if err != nil {
					return err
				}
				tw := tabwriter.NewWriter(env.Stdout, 2, 8, 2, ' ', 0)
				if bf.output == "text" {
					fmt.Fprintln(tw, "TENANT\tULID\tFROM\tUNTIL\tRANGE\tRES\tLEVEL\tSOURCE\tMARKS")
				}
				enc := json.NewEncoder(env.Stdout)
				for _, t := range ts {
					rows, _, err := readTenant(ctx, bkt, t)
					if err != nil {
						return err
					}
					for _, r := range rows {
						if bf.output == "json" {
							if err := enc.Encode(r); err != nil {
								return err
							}
							continue
						}
						if r.Meta == nil {
							fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\tpartial\t\n", t, r.ID)
							continue
						}
						m := r.Meta
						fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\n", t, m.ULID, fmtTime(m.MinTime), fmtTime(m.MaxTime), fmtDur(m.MaxTime-m.MinTime),
							downsample.ResolutionName(m.GPUStore.Downsample.Resolution), m.Compaction.Level, m.GPUStore.Source, marks(r))
					}
				}
				return tw.Flush()
			}
		},
	}
}

func inspectCommand() *Command {
	return &Command{
		Name:    "inspect",
		Summary: "show a tenant's blocks in detail: series, samples, chunks, bytes, labels, sources, marks",
		Doc:     "With `--block`, only those blocks. `--output json` prints each block's whole `meta.json` with its marks.",
		Flags: func(fs *flag.FlagSet, env *Env) func([]string) error {
			var bf bucketFlags
			bf.register(fs, true)
			bf.registerOutput(fs)
			var ids ulidList
			fs.Var(&ids, "block", "ULID of a block to show (repeatable; default: every block of the tenant).")
			return func(args []string) error {
				if len(args) > 0 {
					return usageError("unexpected argument %q", args[0])
				}
				bkt, err := bf.open(true)
				if err != nil {
					return err
				}
				defer bkt.Close()
				rows, _, err := readTenant(context.Background(), bkt, bf.tenant)
				if err != nil {
					return err
				}
				if len(ids) > 0 {
					rows = slices.DeleteFunc(rows, func(r blockRow) bool { return !slices.Contains(ids, r.ID) })
					if len(rows) < len(ids) {
						return fmt.Errorf("%d of the %d blocks asked for are not in tenant %q's bucket", len(ids)-len(rows), len(ids), bf.tenant)
					}
				}
				if bf.output == "json" {
					enc := json.NewEncoder(env.Stdout)
					for _, r := range rows {
						if err := enc.Encode(r); err != nil {
							return err
						}
					}
					return nil
				}
				tw := tabwriter.NewWriter(env.Stdout, 2, 8, 2, ' ', 0)
				fmt.Fprintln(tw, "ULID\tFROM\tUNTIL\tRES\tLEVEL\tSERIES\tSAMPLES\tCHUNKS\tBYTES\tSOURCE\tLABELS\tSOURCES\tMARKS")
				var series, samples, chunks, size uint64
				for _, r := range rows {
					if r.Meta == nil {
						fmt.Fprintf(tw, "%s\t-\t-\t-\t-\t-\t-\t-\t-\tpartial\t\t\t\n", r.ID)
						continue
					}
					m := r.Meta
					fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%d\t%s\n", m.ULID, fmtTime(m.MinTime), fmtTime(m.MaxTime),
						downsample.ResolutionName(m.GPUStore.Downsample.Resolution), m.Compaction.Level, m.Stats.NumSeries, m.Stats.NumSamples, m.Stats.NumChunks,
						m.BucketBytes(), m.GPUStore.Source, labelsString(m.GPUStore.Labels), len(m.Compaction.Sources), marks(r))
					if r.Del == nil {
						series += m.Stats.NumSeries
						samples += m.Stats.NumSamples
						chunks += m.Stats.NumChunks
						size += uint64(m.BucketBytes())
					}
				}
				fmt.Fprintf(tw, "live blocks, all resolutions\t\t\t\t\t%d\t%d\t%d\t%d\t\t\t\t\n", series, samples, chunks, size)
				return tw.Flush()
			}
		},
	}
}

func labelsString(l map[string]string) string {
	keys := slices.Sorted(maps.Keys(l))
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, l[k])
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// ulidList is a repeatable --block flag.
type ulidList []ulid.ULID

func (l *ulidList) String() string {
	s := make([]string, len(*l))
	for i, id := range *l {
		s[i] = id.String()
	}
	return strings.Join(s, ",")
}

func (l *ulidList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		id, err := ulid.ParseStrict(strings.TrimSpace(p))
		if err != nil {
			return fmt.Errorf("block %q: %w", p, err)
		}
		*l = append(*l, id)
	}
	return nil
}

func verifyCommand() *Command {
	return &Command{
		Name:    "verify",
		Summary: "check a tenant's blocks: objects present at their recorded sizes, and (--read) every block read whole",
		Doc: "Reports, per block: a `meta.json` that does not parse, objects missing or of another size than `meta.json` records, " +
			"and with `--read` (the default) every problem `tools bucket upload-blocks` refuses a block for (index order, chunks that do not decode, samples out of order or outside the block's range). " +
			"Overlapping blocks of one group are listed as information: the compactor merges them. Nothing is changed; mark a bad block `no-compact` or `deletion` with `tools bucket mark`. " +
			"Reading downloads each block into `--work-dir`, one at a time.",
		Flags: func(fs *flag.FlagSet, env *Env) func([]string) error {
			var bf bucketFlags
			bf.register(fs, true)
			var ids ulidList
			fs.Var(&ids, "block", "ULID of a block to verify (repeatable; default: every complete block of the tenant).")
			read := fs.Bool("read", true, "Download each block and read it whole (index and every chunk); false: only meta.json and the objects' sizes.")
			work := fs.String("work-dir", "", "Directory the blocks are downloaded into while read (default: the system's temporary directory).")
			return func(args []string) error {
				if len(args) > 0 {
					return usageError("unexpected argument %q", args[0])
				}
				bkt, err := bf.open(true)
				if err != nil {
					return err
				}
				defer bkt.Close()
				return verifyTenant(context.Background(), env.Stdout, bkt, bf.tenant, ids, *read, *work)
			}
		},
	}
}

// errProblems is verify's error when it found problems.
var errProblems = errors.New("problems found")

func verifyTenant(ctx context.Context, out io.Writer, bkt objstore.Bucket, t string, ids []ulid.ULID, read bool, work string) error {
	rows, x, err := readTenant(ctx, bkt, t)
	if err != nil {
		return err
	}
	problems := 0
	for _, id := range x.Corrupted {
		if len(ids) == 0 || slices.Contains(ids, id) {
			fmt.Fprintf(out, "%s: meta.json does not parse or is not valid: the block is never read\n", id)
			problems++
		}
	}
	// Overlaps within each group (information).
	byGroup := map[string][]*block.Meta{}
	for _, r := range rows {
		if r.Meta != nil && r.Del == nil {
			k := fmt.Sprintf("%d@%s", r.Meta.GPUStore.Downsample.Resolution, block.GroupKey(r.Meta)) // resolutions overlap by design
			byGroup[k] = append(byGroup[k], r.Meta)
		}
	}
	for _, k := range slices.Sorted(maps.Keys(byGroup)) {
		ms := byGroup[k]
		for i, a := range ms {
			for _, b := range ms[i+1:] {
				if a.MinTime < b.MaxTime && b.MinTime < a.MaxTime {
					fmt.Fprintf(out, "info: %s and %s of group %s overlap: the compactor merges them\n", a.ULID, b.ULID, k)
				}
			}
		}
	}
	checked := 0
	for _, r := range rows {
		if r.Meta == nil || (len(ids) > 0 && !slices.Contains(ids, r.ID)) {
			continue
		}
		checked++
		m := r.Meta
		bad := false
		for _, f := range m.GPUStore.Files {
			name := block.ObjectName(t, m.ULID, f.ObjectRel())
			a, err := block.ExpectMissing(bkt).Attributes(ctx, name)
			switch {
			case err != nil && bkt.IsObjNotFoundErr(err):
				fmt.Fprintf(out, "%s: %s is missing\n", m.ULID, f.ObjectRel())
				bad = true
			case err != nil:
				return err
			case a.Size != f.BucketBytes():
				fmt.Fprintf(out, "%s: %s is %d bytes, meta.json says %d\n", m.ULID, f.ObjectRel(), a.Size, f.BucketBytes())
				bad = true
			}
		}
		if !bad && read {
			if err := readWhole(ctx, bkt, m, work); err != nil {
				if !errors.Is(err, block.ErrInvalidBlock) && !errors.Is(err, errUnreadable) {
					return err
				}
				fmt.Fprintf(out, "%s: %v\n", m.ULID, err)
				bad = true
			}
		}
		if bad {
			problems++
			continue
		}
		fmt.Fprintf(out, "%s: ok\n", m.ULID)
	}
	if len(ids) > checked {
		return fmt.Errorf("%d of the %d blocks asked for are not complete blocks of tenant %q", len(ids)-checked, len(ids), t)
	}
	if problems > 0 {
		return fmt.Errorf("%w: %d of %d blocks", errProblems, problems, checked)
	}
	return nil
}

var errUnreadable = errors.New("block unreadable")

// readWhole downloads a bucket block and reads it whole.
func readWhole(ctx context.Context, bkt objstore.Bucket, m *block.Meta, work string) error {
	dir, err := os.MkdirTemp(work, "gpustore-verify-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	bdir := filepath.Join(dir, m.ULID.String())
	if err := block.Download(ctx, bkt, m, bdir, errUnreadable); err != nil {
		return err
	}
	_, err = block.VerifyLocal(ctx, bdir)
	return err
}

// withLease runs f while holding the tenant's compactor lease, waiting up
// to wait for a compactor's pass to end.
func withLease(ctx context.Context, bkt objstore.Bucket, t string, wait time.Duration, log io.Writer, f func(ctx context.Context, held *compact.Held) error) error {
	cfg := compact.DefaultConfig()
	host, _ := os.Hostname()
	l := compact.NewBucketLease(bkt, fmt.Sprintf("gpustore-tools@%s/%d", host, os.Getpid()), time.Duration(cfg.LeaseTTL), time.Duration(cfg.LeaseSettle))
	deadline := time.Now().Add(wait)
	var held *compact.Held
	for {
		h, err := l.Acquire(ctx, t)
		if err != nil {
			return err
		}
		if h != nil {
			held = h
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("a compactor holds tenant %q's lease (%s): run again once its pass is over, or wait longer (--lease-wait)", t, compact.LeaseFilename)
		}
		fmt.Fprintf(log, "a compactor is working on tenant %q; waiting for its lease\n", t)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Second):
		}
	}
	ctx, cancel := context.WithCancelCause(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		held.KeepAlive(ctx, func(err error) { cancel(fmt.Errorf("%w: %v", compact.ErrLeaseLost, err)) })
	}()
	err := f(ctx, held)
	if c := context.Cause(ctx); err != nil && c != nil && !errors.Is(c, context.Canceled) {
		err = fmt.Errorf("%w (%v)", err, c)
	}
	cancel(nil)
	<-done
	rctx, rcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer rcancel()
	if rerr := held.Release(rctx); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

func markCommand() *Command {
	return &Command{
		Name:    "mark",
		Summary: "mark blocks for deletion or no-compact (or remove a mark), under the tenant's compactor lease",
		Doc: "`--mark deletion`: readers stop reading the block after the bucket store's `deletion_mark_delay` and the compactor deletes it after `compact.delete_delay`; " +
			"its samples are gone unless another block holds them. `--mark no-compact`: the compactor leaves the block out of compactions (queries still read it), e.g. a block that fails to read. " +
			"`--remove` takes the mark away (a deletion mark only while the block is still there). The marks are Thanos' `deletion-mark.json` and `no-compact-mark.json`.",
		Flags: func(fs *flag.FlagSet, env *Env) func([]string) error {
			var bf bucketFlags
			bf.register(fs, true)
			var ids ulidList
			fs.Var(&ids, "block", "ULID of a block to mark (repeatable). Required.")
			kind := fs.String("mark", "", "deletion or no-compact. Required.")
			details := fs.String("details", "", "Why (recorded in the mark). Required unless --remove.")
			remove := fs.Bool("remove", false, "Remove the mark instead of writing it.")
			wait := fs.Duration("lease-wait", 15*time.Minute, "How long to wait for a compactor's pass on the tenant to end.")
			return func(args []string) error {
				if len(args) > 0 {
					return usageError("unexpected argument %q", args[0])
				}
				if len(ids) == 0 {
					return usageError("--block is required")
				}
				var file string
				switch *kind {
				case "deletion":
					file = block.DeletionMarkFilename
				case "no-compact":
					file = block.NoCompactMarkFilename
				default:
					return usageError("--mark %q: want deletion or no-compact", *kind)
				}
				if *details == "" && !*remove {
					return usageError("--details is required: say why")
				}
				bkt, err := bf.open(true)
				if err != nil {
					return err
				}
				defer bkt.Close()
				ctx := context.Background()
				return withLease(ctx, bkt, bf.tenant, *wait, env.Stderr, func(ctx context.Context, held *compact.Held) error {
					for _, id := range ids {
						if _, err := block.ReadMeta(ctx, bkt, bf.tenant, id); err != nil {
							return fmt.Errorf("block %s of tenant %q: %w", id, bf.tenant, err)
						}
						if err := held.Check(ctx); err != nil {
							return err
						}
						name := block.ObjectName(bf.tenant, id, file)
						if *remove {
							if err := bkt.Delete(ctx, name); err != nil && !bkt.IsObjNotFoundErr(err) {
								return fmt.Errorf("remove %s: %w", name, err)
							}
							fmt.Fprintf(env.Stdout, "%s: %s removed\n", id, file)
							continue
						}
						now := time.Now()
						if *kind == "deletion" {
							err = block.WriteDeletionMark(ctx, bkt, bf.tenant, id, *details, now)
						} else {
							err = block.WriteNoCompactMark(ctx, bkt, bf.tenant, id, "manual", *details, now)
						}
						if err != nil {
							return err
						}
						fmt.Fprintf(env.Stdout, "%s: marked %s\n", id, *kind)
					}
					return nil
				})
			}
		},
	}
}

// selectorList is a repeatable --drop flag of series selectors.
type selectorList [][]*labels.Matcher

func (l *selectorList) String() string { return fmt.Sprint(len(*l), " selectors") }

func (l *selectorList) Set(v string) error {
	ms, err := parser.NewParser(parser.Options{}).ParseMetricSelector(v)
	if err != nil {
		return fmt.Errorf("selector %q: %w", v, err)
	}
	*l = append(*l, ms)
	return nil
}

func rewriteCommand() *Command {
	return &Command{
		Name:    "rewrite",
		Summary: "rewrite blocks without the series matching selectors: a new block each, the old one marked for deletion",
		Doc: "Under the tenant's compactor lease, each block is downloaded into `--work-dir`, written anew without the series that match any `--drop` selector " +
			"(nor their label values in the index's symbol table) and uploaded; the old block gets a deletion mark (\"rewritten into <ULID>\"). " +
			"The new block keeps the old one's compaction sources, with the old one as its parent, so readers take it in the old one's place at once and the compactor treats it as the same data. " +
			"A block of which nothing is left is only marked. Downsampled (5m, 1h) copies of the same hours are blocks of their own: rewrite them too (`tools bucket ls` lists them). " +
			"`--dry-run` says how many series each block would lose.",
		Usage: "",
		Flags: func(fs *flag.FlagSet, env *Env) func([]string) error {
			var bf bucketFlags
			bf.register(fs, true)
			var ids ulidList
			fs.Var(&ids, "block", "ULID of a block to rewrite (repeatable). Required.")
			var drop selectorList
			fs.Var(&drop, "drop", "Series selector ({pod=~\"alice-.*\"}, up{job=\"x\"}) of series to leave out (repeatable). Required.")
			dry := fs.Bool("dry-run", false, "Only say how many series each block would lose.")
			work := fs.String("work-dir", "", "Directory the blocks are downloaded into and rewritten in (default: the system's temporary directory).")
			wait := fs.Duration("lease-wait", 15*time.Minute, "How long to wait for a compactor's pass on the tenant to end.")
			return func(args []string) error {
				if len(args) > 0 {
					return usageError("unexpected argument %q", args[0])
				}
				if len(ids) == 0 || len(drop) == 0 {
					return usageError("--block and --drop are required")
				}
				bkt, err := bf.open(true)
				if err != nil {
					return err
				}
				defer bkt.Close()
				ctx := context.Background()
				return withLease(ctx, bkt, bf.tenant, *wait, env.Stderr, func(ctx context.Context, held *compact.Held) error {
					for _, id := range ids {
						if err := rewriteBlock(ctx, env.Stdout, bkt, held, bf.tenant, id, drop, *dry, *work); err != nil {
							return err
						}
					}
					return nil
				})
			}
		},
	}
}

func rewriteBlock(ctx context.Context, out io.Writer, bkt objstore.Bucket, held *compact.Held, t string, id ulid.ULID, drop [][]*labels.Matcher, dry bool, work string) error {
	m, err := block.ReadMeta(ctx, bkt, t, id)
	if err != nil {
		return fmt.Errorf("block %s of tenant %q: %w", id, t, err)
	}
	if d, err := block.ReadDeletionMark(ctx, bkt, t, id); err != nil && !errors.Is(err, block.ErrBadMark) {
		return err
	} else if d != nil {
		return fmt.Errorf("block %s is marked for deletion (%s): rewrite the block that replaced it", id, d.Details)
	}
	dir, err := os.MkdirTemp(work, "gpustore-rewrite-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	src := filepath.Join(dir, "src", id.String())
	if err := block.Download(ctx, bkt, m, src, errUnreadable); err != nil {
		return err
	}
	if dry {
		dst := filepath.Join(dir, "dst")
		if err := os.MkdirAll(dst, 0o755); err != nil {
			return err
		}
		res, err := rewrite.Block(ctx, nil, src, dst, rewrite.Options{Drop: drop, Lineage: rewrite.Replacement})
		switch {
		case err != nil:
			return err
		case res.DroppedSeries == 0:
			fmt.Fprintf(out, "%s: no series matches; left as it is\n", id)
		case res.Meta == nil:
			fmt.Fprintf(out, "%s: would lose all its %d series: it would be marked for deletion\n", id, res.DroppedSeries)
		default:
			fmt.Fprintf(out, "%s: would lose %d of %d series\n", id, res.DroppedSeries, m.Stats.NumSeries)
		}
		return nil
	}
	rw, err := compact.RewriteBlock(ctx, bkt, held, t, m, src, false, rewrite.Options{Drop: drop}, nil)
	switch {
	case err != nil:
		return err
	case !rw.Changed:
		fmt.Fprintf(out, "%s: no series matches; left as it is\n", id)
		return nil
	case rw.New == nil:
		fmt.Fprintf(out, "%s: marked for deletion (rewritten: no series left)\n", id)
	default:
		fmt.Fprintf(out, "%s: rewritten into %s without %d series\n", id, rw.New.ULID, rw.DroppedSeries)
		fmt.Fprintf(out, "%s: marked for deletion (rewritten into %s)\n", id, rw.New.ULID)
	}
	return nil
}

// labelFlags is a repeatable --label name=value flag.
type labelFlags map[string]string

func (l labelFlags) String() string { return labelsString(l) }

func (l labelFlags) Set(v string) error {
	n, val, ok := strings.Cut(v, "=")
	if !ok || !isLabelName(n) {
		return fmt.Errorf("label %q: want name=value", v)
	}
	l[n] = strings.Trim(val, `"`)
	return nil
}

func isLabelName(n string) bool {
	for i, r := range n {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || i > 0 && r >= '0' && r <= '9') {
			return false
		}
	}
	return n != ""
}

func uploadCommand() *Command {
	return &Command{
		Name:    "upload-blocks",
		Summary: "upload Prometheus TSDB blocks (a data directory, a snapshot, promtool's create-blocks-from output) into a tenant's bucket",
		Usage:   "DIR...",
		Doc: "Each DIR is a block or a directory of blocks (what Prometheus' `--storage.tsdb.path`, a snapshot under `snapshots/`, or `promtool tsdb create-blocks-from openmetrics` holds; the WAL and head chunks are not blocks and are left alone: take a snapshot to include the head). " +
			"Every block is first read whole and refused, with the reason, when its index or chunks do not read, its samples are out of order or outside its time range, or its counts disagree with its `meta.json`; " +
			"a block that overlaps a block of the bucket marked no-compact is refused too (the compactor would never merge them). If any block is refused nothing is uploaded, unless `--skip-invalid`. " +
			"Blocks already in the bucket (by ULID, or compacted into a block holding all their sources) are skipped, so running it again after an interruption uploads only the rest. " +
			"A block crossing a boundary of the compactor's largest range (`--compact.block-ranges`, 14d by default) is cut there, and a block with tombstones is rewritten without the deleted samples; each block's time range is widened to the smallest range's grid (2h), as a receiver's blocks are. " +
			"The blocks join the group of the tenant's raw blocks (their external labels, when they all share one set; else `--label`), so the running compactor merges them with their neighbours, vertically where they overlap the tenant's data, and downsamples them; " +
			"the bucket store serves them within one `bucket_store.sync_interval`. Raw retention applies to them like to any raw block: history older than `compact.retention.raw` (or the tenant's `compactor_retention_raw`) is kept at 5m and 1h only, once downsampled.",
		Flags: func(fs *flag.FlagSet, env *Env) func([]string) error {
			var bf bucketFlags
			bf.register(fs, true)
			lbls := labelFlags{}
			fs.Var(lbls, "label", "External label name=value of the uploaded blocks' group (repeatable; default: those of the tenant's raw blocks).")
			ranges := compact.DefaultConfig().BlockRanges
			fs.Var(&ranges, "compact.block-ranges", "The compactor's block ranges (as its --compact.block-ranges): blocks are cut at the largest one's boundaries.")
			dry := fs.Bool("dry-run", false, "Verify and say what would be uploaded, upload nothing.")
			skip := fs.Bool("skip-invalid", false, "Upload the valid blocks even when some are refused (exit code 1 all the same).")
			work := fs.String("work-dir", "", "Directory blocks that need cutting or rewriting are written into before upload (default: the system's temporary directory).")
			return func(args []string) error {
				if len(args) == 0 {
					return usageError("no DIR: name a block or a directory of blocks")
				}
				bkt, err := bf.open(true)
				if err != nil {
					return err
				}
				defer bkt.Close()
				var explicit map[string]string
				if len(lbls) > 0 {
					explicit = lbls
				}
				ms := make([]int64, len(ranges))
				for i, r := range ranges {
					ms[i] = time.Duration(r).Milliseconds()
				}
				return uploadBlocks(context.Background(), env, bkt, bf.tenant, explicit, ms, args, *dry, *skip, *work)
			}
		},
	}
}

func uploadBlocks(ctx context.Context, env *Env, bkt objstore.Bucket, t string, lbls map[string]string, ranges []int64, dirs []string, dry, skipInvalid bool, work string) error {
	work, err := os.MkdirTemp(work, "gpustore-upload-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(work)
	var locals []blockupload.Local
	for _, d := range dirs {
		bs, skipped, err := blockupload.Find(d)
		for _, s := range skipped {
			fmt.Fprintf(env.Stderr, "skipped %s\n", s)
		}
		if err != nil {
			return err
		}
		locals = append(locals, bs...)
	}
	b, err := blockupload.ReadBucket(ctx, bkt, t, lbls)
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "tenant %q: %d blocks to verify; uploaded blocks join the group %s\n", t, len(locals), labelsString(b.Labels))
	start := time.Now()
	var plans []blockupload.Plan
	refused := 0
	for _, l := range locals {
		p := blockupload.Judge(ctx, b, l, ranges)
		if p.Refused != nil {
			refused++
			fmt.Fprintf(env.Stdout, "%s: refused: %v\n", l.Dir, p.Refused)
		}
		plans = append(plans, p)
	}
	if refused > 0 && !skipInvalid {
		return fmt.Errorf("%d of %d blocks refused, nothing uploaded (--skip-invalid uploads the others)", refused, len(locals))
	}
	var blocks, samples, bytes int64
	for _, p := range plans {
		if p.Refused != nil {
			continue
		}
		for _, pc := range p.Pieces {
			if pc.Skip != "" {
				fmt.Fprintf(env.Stdout, "%s: %s %s: skipped: %s\n", p.Block.Dir, pc.ULID, span(pc.MinTime, pc.MaxTime), pc.Skip)
			}
		}
		if !p.Uploads() {
			continue
		}
		if dry {
			fmt.Fprintf(env.Stdout, "%s: would upload %s (%d series, %d samples)\n", p.Block.Dir, pieces(p), p.Verified.Series, p.Verified.Samples)
			continue
		}
		ms, err := blockupload.Upload(ctx, bkt, b, p, work, nil)
		if err != nil {
			return err
		}
		for _, m := range ms {
			blocks++
			samples += int64(m.Stats.NumSamples)
			bytes += m.BucketBytes()
			fmt.Fprintf(env.Stdout, "%s: uploaded %s %s (%d series, %d samples)\n", p.Block.Dir, m.ULID, span(m.MinTime, m.MaxTime), m.Stats.NumSeries, m.Stats.NumSamples)
		}
	}
	if !dry {
		took := time.Since(start)
		fmt.Fprintf(env.Stdout, "uploaded %d blocks, %d samples, %d bytes in %s (%.0f samples/s)\n", blocks, samples, bytes, took.Round(time.Millisecond), float64(samples)/max(took.Seconds(), 1e-9))
	}
	if refused > 0 {
		return fmt.Errorf("%d of %d blocks refused", refused, len(locals))
	}
	return nil
}

func pieces(p blockupload.Plan) string {
	var s []string
	for _, pc := range p.Pieces {
		if pc.Skip == "" {
			s = append(s, pc.ULID.String()+" "+span(pc.MinTime, pc.MaxTime))
		}
	}
	return strings.Join(s, ", ")
}

func span(mint, maxt int64) string { return "[" + fmtTime(mint) + ", " + fmtTime(maxt) + ")" }
