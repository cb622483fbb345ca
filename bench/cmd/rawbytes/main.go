// Command rawbytes measures what a tenant's raw blocks take in a folder
// bucket per raw sample, as they are and as each block file encoding would
// store them (pkg/block: none, zstd, zstd-nocrc, zstd-columns), beside a VictoriaMetrics
// data directory holding the same samples (issue 41 item 6). With -rewrite
// it re-encodes the raw blocks the compactor wrote (level 2 and up) in place,
// as a compactor with -compact.raw-encoding would have written them, and
// rebuilds the tenant's bucket index: so a kept panelbench data set can be
// queried plain and encoded.
//
//	go run ./bench/cmd/rawbytes -bucket /work/pb/512x1d/gpustore/data/bucket \
//	    -vm /work/pb/512x1d/victoriametrics/data -vm.samples 46637704
package main

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/storage/bucketindex"
)

func main() {
	bucketDir := flag.String("bucket", "", "Folder bucket (the directory holding the tenants).")
	tenant := flag.String("tenant", "default", "Tenant.")
	encodings := flag.String("encodings", "none,zstd,zstd-nocrc,zstd-columns", "Encodings to measure (zstd-columns: the chunk segments as columns, the index as zstd-nocrc).")
	frames := flag.String("frame-bytes", "", "Comma-separated chunk-segment frame sizes to measure the encodings with, the first for -rewrite (default: block.FrameBytes, block.ColumnsFrameBytes for zstd-columns).")
	vmDir := flag.String("vm", "", "A VictoriaMetrics data directory holding the same data: its bytes per sample beside.")
	vmSamples := flag.Int64("vm.samples", 0, "Samples written to VictoriaMetrics.")
	rewrite := flag.String("rewrite", "", "Re-encode the tenant's raw blocks of level 2 and up in place: their chunk segments in this encoding.")
	rewriteIndex := flag.String("rewrite-index", "none", "With -rewrite: their index in this encoding (-compact.raw-index-encoding).")
	transform := flag.String("transform", "", "A local TSDB block directory: estimate a reversible column transform of its chunks (transform.go) instead.")
	flag.Parse()
	if *transform != "" {
		if err := transformEstimate(*transform); err != nil {
			fmt.Fprintln(os.Stderr, "rawbytes:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(context.Background(), *bucketDir, *tenant, *encodings, *frames, *vmDir, *vmSamples, *rewrite, *rewriteIndex); err != nil {
		fmt.Fprintln(os.Stderr, "rawbytes:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, dir, tenant, encodings, frames, vmDir string, vmSamples int64, rewrite, rewriteIndex string) error {
	if dir == "" {
		return fmt.Errorf("-bucket is required")
	}
	bkt, err := filesystem.NewBucket(dir)
	if err != nil {
		return err
	}
	metas, err := rawMetas(ctx, bkt, dir, tenant)
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "rawbytes-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	var sizes []int64 // nil: each encoding's default
	if frames != "" {
		for _, s := range strings.Split(frames, ",") {
			v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
			if err != nil {
				return err
			}
			sizes = append(sizes, v)
		}
	}
	if rewrite != "" {
		if sizes != nil {
			block.FrameBytes, block.ColumnsFrameBytes = sizes[0], sizes[0]
		}
		return rewriteBlocks(ctx, bkt, tmp, tenant, metas, rewrite, rewriteIndex)
	}

	tw := tabwriter.NewWriter(os.Stdout, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "blocks\tlevel\tsamples\tencoding\tframe\tindex bytes\tchunk bytes\tbytes/sample\t")
	var all, upper int64
	for _, m := range metas {
		all += int64(m.Stats.NumSamples)
		if m.Compaction.Level >= 2 {
			upper += int64(m.Stats.NumSamples)
		}
	}
	// As stored now.
	var idx, chk, idx2, chk2 int64
	for _, m := range metas {
		for _, f := range m.GPUStore.Files {
			n := f.BucketBytes()
			isIdx := f.RelPath == block.IndexFilename
			add(&idx, &chk, isIdx, n)
			if m.Compaction.Level >= 2 {
				add(&idx2, &chk2, isIdx, n)
			}
		}
	}
	row(tw, "all raw", "1+", all, "as stored", "", idx, chk)
	row(tw, "compacted raw", "2+", upper, "as stored", "", idx2, chk2)

	for _, enc := range strings.Split(encodings, ",") {
		enc, err := block.ParseEncoding(strings.TrimSpace(enc))
		if err != nil {
			return err
		}
		fs := []int64{block.FrameBytes}
		switch {
		case enc != block.EncodingNone && sizes != nil:
			fs = sizes
		case enc == block.EncodingZstdColumns:
			fs = []int64{block.ColumnsFrameBytes}
		}
		defaults := [2]int64{block.FrameBytes, block.ColumnsFrameBytes}
		for _, fb := range fs {
			block.FrameBytes, block.ColumnsFrameBytes = fb, fb
			var i1, c1, i2, c2 int64
			for _, m := range metas {
				ib, cb, err := encodedBytes(ctx, bkt, tmp, m, enc)
				if err != nil {
					return err
				}
				i1, c1 = i1+ib, c1+cb
				if m.Compaction.Level >= 2 {
					i2, c2 = i2+ib, c2+cb
				}
			}
			name := enc
			if name == "" {
				name = "none"
			}
			row(tw, "all raw", "1+", all, name, strconv.FormatInt(fb>>10, 10)+" KiB", i1, c1)
			row(tw, "compacted raw", "2+", upper, name, strconv.FormatInt(fb>>10, 10)+" KiB", i2, c2)
		}
		block.FrameBytes, block.ColumnsFrameBytes = defaults[0], defaults[1]
	}
	if vmDir != "" {
		n, err := duBytes(vmDir)
		if err != nil {
			return err
		}
		parts, _ := duBytes(filepath.Join(vmDir, "data"))
		fmt.Fprintf(tw, "VictoriaMetrics\t\t%d\twhole data dir\t\t\t%d\t%.3f\t\n", vmSamples, n, float64(n)/float64(vmSamples))
		if parts > 0 {
			fmt.Fprintf(tw, "VictoriaMetrics\t\t%d\tdata/ (parts and indexdb)\t\t\t%d\t%.3f\t\n", vmSamples, parts, float64(parts)/float64(vmSamples))
		}
	}
	return tw.Flush()
}

func add(idx, chk *int64, isIdx bool, n int64) {
	if isIdx {
		*idx += n
	} else {
		*chk += n
	}
}

func row(tw *tabwriter.Writer, what, level string, samples int64, enc, frame string, idx, chk int64) {
	fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%.3f\t\n", what, level, samples, enc, frame, idx, chk, float64(idx+chk)/float64(samples))
}

// rawMetas reads the metas of the tenant's raw blocks not marked for deletion.
func rawMetas(ctx context.Context, bkt objstore.Bucket, dir, tenant string) ([]*block.Meta, error) {
	ents, err := os.ReadDir(filepath.Join(dir, tenant))
	if err != nil {
		return nil, err
	}
	var out []*block.Meta
	for _, e := range ents {
		id, ok := block.ParseDir(e.Name())
		if !ok {
			continue
		}
		if _, err := os.Stat(filepath.Join(dir, tenant, e.Name(), "deletion-mark.json")); err == nil {
			continue
		}
		m, err := block.ReadMeta(ctx, bkt, tenant, id)
		if err != nil {
			return nil, err
		}
		if m.GPUStore.Downsample.Resolution == block.ResolutionRaw {
			out = append(out, m)
		}
	}
	return out, nil
}

// encodedBytes is what m's index and chunk files take stored in enc.
func encodedBytes(ctx context.Context, bkt objstore.Bucket, tmp string, m *block.Meta, enc string) (idx, chk int64, err error) {
	local := filepath.Join(tmp, "block")
	defer os.RemoveAll(local)
	if err := block.Download(ctx, bkt, m, local, fmt.Errorf("bad block %s", m.ULID)); err != nil {
		return 0, 0, err
	}
	scratch, err := filesystem.NewBucket(filepath.Join(tmp, "scratch"))
	if err != nil {
		return 0, 0, err
	}
	defer os.RemoveAll(filepath.Join(tmp, "scratch"))
	nm := *m
	if err := block.UploadEncoded(ctx, scratch, local, &nm, block.Uniform(enc)); err != nil {
		return 0, 0, err
	}
	for _, f := range nm.GPUStore.Files {
		add(&idx, &chk, f.RelPath == block.IndexFilename, f.BucketBytes())
	}
	return idx, chk, nil
}

// rewriteBlocks stores the compacted raw blocks' chunks in enc and their
// index in indexEnc, meta.json last, then removes the objects of their old
// encoding and rebuilds the bucket index.
func rewriteBlocks(ctx context.Context, bkt objstore.Bucket, tmp, tenant string, metas []*block.Meta, enc, indexEnc string) error {
	var want block.Encodings
	var err error
	if want.Chunks, err = block.ParseEncoding(enc); err != nil {
		return err
	}
	if want.Index, err = block.ParseEncoding(indexEnc); err != nil {
		return err
	}
	for _, m := range metas {
		if m.Compaction.Level < 2 || len(m.GPUStore.Files) == 0 || block.EncodingsOf(m) == want {
			continue
		}
		local := filepath.Join(tmp, m.ULID.String())
		if err := block.Download(ctx, bkt, m, local, fmt.Errorf("bad block %s", m.ULID)); err != nil {
			return err
		}
		old := m.GPUStore.Files
		nm := *m
		if err := block.UploadEncoded(ctx, bkt, local, &nm, want); err != nil {
			return err
		}
		keep := map[string]bool{}
		for _, f := range nm.GPUStore.Files {
			keep[f.ObjectRel()] = true
		}
		for _, f := range old {
			if !keep[f.ObjectRel()] {
				if err := bkt.Delete(ctx, block.ObjectName(tenant, m.ULID, f.ObjectRel())); err != nil {
					return err
				}
			}
		}
		_ = os.RemoveAll(local)
		fmt.Printf("%s: level %d, %d bytes -> %d (chunks %s, index %s)\n", m.ULID, m.Compaction.Level, m.BucketBytes(), nm.BucketBytes(), enc, indexEnc)
	}
	x, err := bucketindex.Update(ctx, bkt, tenant, nil)
	if err != nil {
		return err
	}
	return bucketindex.Write(ctx, bkt, x)
}

func duBytes(dir string) (int64, error) {
	var n int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		st, err := d.Info()
		if err == nil {
			n += st.Size()
		}
		return err
	})
	return n, err
}
