package compact

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/grafana/dskit/flagext"
	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

// Config is the compactor's configuration (the compact section of the YAML).
type Config struct {
	// Interval is the wait between compaction passes over every tenant.
	Interval model.Duration `yaml:"interval"`
	// DataDir is the working directory blocks are downloaded to and compacted
	// in; it is emptied at start. Empty: <storage.tsdb.path>/compact.
	DataDir string `yaml:"data_dir"`
	// BlockRanges are the levels, smallest first: the receivers' block
	// duration, then each larger block the compactor builds.
	BlockRanges DurationList `yaml:"block_ranges"`
	// DeleteDelay is how long a block marked for deletion stays in the bucket
	// before the compactor deletes it, so readers that still use it (running
	// queries, bucket stores that have not synced) never lose it under them.
	DeleteDelay model.Duration `yaml:"delete_delay"`
	// PartialDeleteDelay: a block directory without meta.json (an upload cut
	// short by a crash) whose objects are all older than this is deleted.
	// It must be far longer than any upload takes.
	PartialDeleteDelay model.Duration `yaml:"partial_delete_delay"`
	// Retention per resolution: blocks wholly older are marked for deletion
	// (0 keeps them forever), a raw block only once 5m or 1h data holds its
	// hours and a 5m block only once 1h data does; retentions that would
	// contradict that are refused (validateRetentionOrder). Each can be
	// overridden per tenant in the limits overrides file
	// (compactor_retention_raw, _5m, _1h). The 5m and 1h resolutions are written by
	// downsampling.
	RetentionRaw model.Duration `yaml:"retention_raw"`
	Retention5m  model.Duration `yaml:"retention_5m"`
	Retention1h  model.Duration `yaml:"retention_1h"`
	// LeaseTTL is how long a compactor's lease on a tenant lasts without
	// renewal; LeaseSettle is the wait between writing the lease and reading
	// it back (see BucketLease).
	LeaseTTL    model.Duration `yaml:"lease_ttl"`
	LeaseSettle model.Duration `yaml:"lease_settle"`
	// Downsample writes 5m and 1h blocks (pkg/downsample) in each pass.
	Downsample bool `yaml:"downsample"`
	// DownsampleFoldLabels are merged away when raw data of the metrics
	// matching DownsampleFoldMetrics is downsampled (downsample.Fold), e.g.
	// dcgm-exporter's pod label, so that 5m and 1h data hold one series per
	// GPU instead of one per GPU and job. Counters are never folded. Empty
	// (the default): off, every label is kept.
	DownsampleFoldLabels  flagext.StringSliceCSV `yaml:"downsample_fold_labels"`
	DownsampleFoldMetrics string                 `yaml:"downsample_fold_metrics"`
	// DownsampleEncoding is how the 5m and 1h blocks' index and chunk files
	// are stored in the bucket: "zstd-nocrc" (the default: compressed
	// without the TSDB's per-entry CRC32s, which reading recomputes; read
	// whole), "zstd-columns" (zstd-nocrc with the XOR chunks' samples
	// rewritten as columns of timestamps and values before compressing),
	// "zstd" (compressed as they are) or "none" (as the TSDB writes
	// them, range-read). Raw blocks are
	// stored as RawEncoding says. Blocks keep the encoding they were written
	// with; readers read both.
	DownsampleEncoding string `yaml:"downsample_encoding"`
	// RawEncoding is how the raw blocks the compactor writes (8h and
	// larger: level 2 and up) store their chunk segments, in the same
	// encodings. The receivers' 2h blocks are always stored as the TSDB
	// writes them. zstd-columns (the default) stores a 1024-GPU cluster's
	// raw chunks and plain index in 0.68 bytes a sample, under
	// VictoriaMetrics' 1.06 on the same data, against 4.26 plain; a query
	// reads each chunk alone from its frame (block.ColumnFrame), so panels
	// cost what they cost over plain blocks warm and 1.09-1.13× the CPU on
	// a cold first view (bench/RESULTS.md, issue 41 item 6). none keeps
	// the plain files.
	RawEncoding string `yaml:"raw_encoding"`
	// RawIndexEncoding is how those raw blocks store their index, apart
	// from their chunks: a query of one metric reads a series entry in
	// every GPU's stretch of the index's series section (Hostname and UUID
	// sort before __name__), so a cold read of an encoded index decodes
	// nearly all of it, where a plain one range-reads a page a GPU. Plain by
	// default: an index is a small part of a compacted raw block's bytes
	// (bench/RESULTS.md, issue 41 item 6).
	RawIndexEncoding string `yaml:"raw_index_encoding"`
}

// DefaultConfig: 2h → 8h → 2d → 14d, a pass every 5 minutes, deletion 48h
// after marking, raw data kept 30 days and downsampled data a year.
func DefaultConfig() Config {
	day := 24 * time.Hour
	return Config{
		Interval:           model.Duration(5 * time.Minute),
		BlockRanges:        DurationList{model.Duration(2 * time.Hour), model.Duration(8 * time.Hour), model.Duration(2 * day), model.Duration(14 * day)},
		DeleteDelay:        model.Duration(2 * day),
		PartialDeleteDelay: model.Duration(2 * day),
		RetentionRaw:       model.Duration(30 * day),
		Retention5m:        model.Duration(365 * day),
		Retention1h:        model.Duration(365 * day),
		LeaseTTL:           model.Duration(5 * time.Minute),
		LeaseSettle:        model.Duration(2 * time.Second),
		Downsample:         true,
		// Folding is asked for: it changes which series the 5m and 1h
		// data hold. When on, its scope is dcgm-exporter's metrics.
		DownsampleFoldMetrics: "DCGM_.+",
		DownsampleEncoding:    block.EncodingZstdNoCRC,
		RawEncoding:           block.EncodingZstdColumns,
		RawIndexEncoding:      "none",
	}
}

// fold is the configured downsample.Fold (nil: off).
func (c Config) fold() (*downsample.Fold, error) {
	return downsample.NewFold(c.DownsampleFoldLabels, c.DownsampleFoldMetrics)
}

// Validate checks the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.Interval <= 0 {
		errs = append(errs, errors.New("compact interval must be positive"))
	}
	if len(c.BlockRanges) < 2 {
		errs = append(errs, errors.New("compact block ranges need at least two levels"))
	}
	for i, r := range c.BlockRanges {
		if r <= 0 {
			errs = append(errs, fmt.Errorf("compact block range %s must be positive", r))
		}
		if i > 0 && (r <= c.BlockRanges[i-1] || r%c.BlockRanges[i-1] != 0) {
			errs = append(errs, fmt.Errorf("compact block range %s must be a multiple of %s", r, c.BlockRanges[i-1]))
		}
	}
	if c.DeleteDelay < 0 || c.PartialDeleteDelay <= 0 {
		errs = append(errs, errors.New("compact delete delays must not be negative (partial: positive)"))
	}
	if c.RetentionRaw < 0 || c.Retention5m < 0 || c.Retention1h < 0 {
		errs = append(errs, errors.New("compact retention must not be negative"))
	}
	errs = append(errs, c.validateRetentionOrder()...)
	if _, err := c.fold(); err != nil {
		errs = append(errs, err)
	}
	if _, err := block.ParseEncoding(c.DownsampleEncoding); err != nil {
		errs = append(errs, fmt.Errorf("compact.downsample.encoding: %w", err))
	}
	if _, err := block.ParseEncoding(c.RawEncoding); err != nil {
		errs = append(errs, fmt.Errorf("compact.raw-encoding: %w", err))
	}
	if _, err := block.ParseEncoding(c.RawIndexEncoding); err != nil {
		errs = append(errs, fmt.Errorf("compact.raw-index-encoding: %w", err))
	}
	if c.LeaseTTL <= 0 || c.LeaseSettle < 0 || c.LeaseSettle >= c.LeaseTTL/3 {
		errs = append(errs, fmt.Errorf("compact lease: want ttl > 0 and 0 <= settle (%s) < ttl/3 (%s)", c.LeaseSettle, c.LeaseTTL/3))
	}
	return errors.Join(errs...)
}

// validateRetentionOrder refuses retentions under which a resolution's
// blocks would be due for deletion while no coarser resolution holds their
// hours any more: retention deletes a block only once a coarser one does
// (mayDelete), so such a block would stay forever, against its retention.
// 0 is forever.
func (c Config) validateRetentionOrder() []error {
	outlives := func(coarse, fine model.Duration) bool { return coarse == 0 || coarse >= fine }
	var errs []error
	if c.Retention5m != 0 && !outlives(c.Retention1h, c.Retention5m) {
		errs = append(errs, fmt.Errorf("compact.retention.1h (%s) is shorter than compact.retention.5m (%s): 5m data is deleted only once 1h data holds its hours, so it would be kept past its retention; set retention.1h at least as long (0: forever)",
			c.Retention1h, c.Retention5m))
	}
	if c.Downsample && c.RetentionRaw != 0 && !outlives(c.Retention5m, c.RetentionRaw) && !outlives(c.Retention1h, c.RetentionRaw) {
		errs = append(errs, fmt.Errorf("compact.retention.raw (%s) is longer than compact.retention.5m (%s) and compact.retention.1h (%s): raw data is deleted only once downsampled data holds its hours, so it would be kept past its retention; keep 5m or 1h data at least as long (0: forever)",
			c.RetentionRaw, c.Retention5m, c.Retention1h))
	}
	return errs
}

// ranges returns BlockRanges in milliseconds.
func (c Config) ranges() []int64 {
	out := make([]int64, len(c.BlockRanges))
	for i, r := range c.BlockRanges {
		out[i] = time.Duration(r).Milliseconds()
	}
	return out
}

// RegisterFlags binds the compactor's flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Var(&c.Interval, "compact.interval", "Wait between compaction passes over the bucket.")
	fs.StringVar(&c.DataDir, "compact.data-dir", c.DataDir, "Working directory for compaction (emptied at start). Default: <storage.tsdb.path>/compact.")
	fs.Var(&c.BlockRanges, "compact.block-ranges", "Comma-separated block levels, smallest (the receivers' block duration) first.")
	fs.Var(&c.DeleteDelay, "compact.delete-delay", "How long a block marked for deletion stays in the bucket before it is deleted.")
	fs.Var(&c.PartialDeleteDelay, "compact.partial-delete-delay", "Delete a block directory without meta.json (a crashed upload) once all its objects are this old.")
	fs.Var(&c.RetentionRaw, "compact.retention.raw", "How long raw blocks stay in the bucket (0: forever); per tenant: compactor_retention_raw in the limits overrides file.")
	fs.Var(&c.Retention5m, "compact.retention.5m", "How long 5m-resolution (downsampled) blocks stay in the bucket (0: forever); per tenant: compactor_retention_5m in the limits overrides file.")
	fs.Var(&c.Retention1h, "compact.retention.1h", "How long 1h-resolution (downsampled) blocks stay in the bucket (0: forever); per tenant: compactor_retention_1h in the limits overrides file.")
	fs.Var(&c.LeaseTTL, "compact.lease-ttl", "How long a compactor's lease on a tenant lasts without renewal.")
	fs.BoolVar(&c.Downsample, "compact.downsample", c.Downsample, "Downsample finished blocks to 5m and 1h resolution (raw retention then waits for the 5m data).")
	fs.Var(&c.DownsampleFoldLabels, "compact.downsample.fold-labels", "Comma-separated labels merged away when raw data is downsampled, for the gauges among the metrics of -compact.downsample.fold-metrics (e.g. pod: one 5m/1h series per GPU instead of one per GPU and pod; counters are never folded; queries naming them read raw data where it exists). Empty (the default): keep every label.")
	fs.StringVar(&c.DownsampleFoldMetrics, "compact.downsample.fold-metrics", c.DownsampleFoldMetrics, "Regular expression (anchored) of the metric names whose series -compact.downsample.fold-labels applies to.")
	fs.StringVar(&c.DownsampleEncoding, "compact.downsample.encoding", c.DownsampleEncoding, "How 5m and 1h blocks' index and chunk files are stored in the bucket: zstd-nocrc (compressed without the TSDB's per-chunk and per-series CRC32s, which readers recompute: about a fifth of the bytes; read a frame at a time), zstd-columns (zstd-nocrc with the chunks' samples rewritten as columns of timestamps and values before compressing: fewer bytes, more CPU to decode), zstd (compressed as they are) or none (as the TSDB writes them). Blocks keep the encoding they were written with.")
	fs.StringVar(&c.RawEncoding, "compact.raw-encoding", c.RawEncoding, "How the raw blocks the compactor writes (8h and larger) store their chunk files in the bucket, as -compact.downsample.encoding (zstd-columns: a fifth of zstd-nocrc's bytes, each chunk read alone; zstd-nocrc, zstd or none). The receivers' 2h blocks are always stored as the TSDB writes them; blocks keep the encoding they were written with.")
	fs.StringVar(&c.RawIndexEncoding, "compact.raw-index-encoding", c.RawIndexEncoding, "How those raw blocks store their index (none, zstd-nocrc or zstd): plain by default, since a cold query of one metric reads a series entry in every GPU's stretch of the index.")
	fs.Var(&c.LeaseSettle, "compact.lease-settle", "Wait between writing a tenant's lease and reading it back; must exceed how long a bucket write can lag (below lease-ttl/3).")
}

// DurationList is a comma-separated list of durations ("2h,8h,2d,14d").
type DurationList []model.Duration

// String implements flag.Value.
func (d *DurationList) String() string {
	if d == nil {
		return ""
	}
	s := make([]string, len(*d))
	for i, v := range *d {
		s[i] = v.String()
	}
	return strings.Join(s, ",")
}

// Set implements flag.Value.
func (d *DurationList) Set(s string) error {
	var out DurationList
	for _, p := range strings.Split(s, ",") {
		v, err := model.ParseDuration(strings.TrimSpace(p))
		if err != nil {
			return err
		}
		out = append(out, v)
	}
	*d = out
	return nil
}
