package bucketstore

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
)

// testSeries is the label sets of a small GPU cluster: a few metrics per GPU,
// one label with many values (to cross the index's 32-entry sampling), and
// label values that sort before and after the others.
func testSeries(nodes int) []labels.Labels {
	var out []labels.Labels
	for _, metric := range []string{"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE"} {
		for n := 0; n < nodes; n++ {
			for g := 0; g < 8; g++ {
				out = append(out, labels.FromStrings(
					"__name__", metric,
					"Hostname", fmt.Sprintf("node-%03d", n),
					"gpu", fmt.Sprint(g),
					"UUID", fmt.Sprintf("GPU-%08x-%04d", n*8+g, n*8+g),
					"modelName", "NVIDIA H100 80GB HBM3",
				))
			}
		}
	}
	out = append(out,
		labels.FromStrings("__name__", "up", "job", "a"),
		labels.FromStrings("__name__", "up", "job", "zzz", "extra", ""),
	)
	return out
}

// sampleValue is deterministic per series and time, with some NaN/Inf.
func sampleValue(i int, ts int64) float64 {
	switch {
	case i == 1 && ts%(60_000*7) == 0:
		return math.NaN()
	case i == 2 && ts%(60_000*11) == 0:
		return math.Inf(1)
	}
	return float64((int64(i)*7919+ts/1000)%1000) / 10
}

// writeBlock writes one block of series with samples every step in [mint, maxt).
func writeBlock(t testing.TB, dir string, series []labels.Labels, mint, maxt, step int64) string {
	t.Helper()
	w, err := tsdb.NewBlockWriter(slog.New(slog.DiscardHandler), dir, maxt-mint)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	ctx := context.Background()
	for ts := mint; ts < maxt; ts += step {
		app := w.Appender(ctx)
		for i, ls := range series {
			if _, err := app.Append(0, ls, ts, sampleValue(i, ts)); err != nil {
				t.Fatal(err)
			}
		}
		if err := app.Commit(); err != nil {
			t.Fatal(err)
		}
	}
	id, err := w.Flush(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, id.String())
}

// uploadBlock uploads a local block for tenant and returns its meta.
func uploadBlock(t testing.TB, bkt objstore.Bucket, tenant, dir string) block.Meta {
	t.Helper()
	return uploadEncodedBlock(t, bkt, tenant, dir, block.EncodingNone)
}

// uploadEncodedBlock uploads with the block's files stored in encoding.
func uploadEncodedBlock(t testing.TB, bkt objstore.Bucket, tenant, dir, encoding string) block.Meta {
	t.Helper()
	bm, err := block.ReadLocalMeta(dir)
	if err != nil {
		t.Fatal(err)
	}
	meta := block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{
		Version: block.MetaVersion, Tenant: tenant, Labels: map[string]string{}, Source: block.SourceReceive,
	}}
	if err := block.UploadEncoded(context.Background(), bkt, dir, &meta, block.Uniform(encoding)); err != nil {
		t.Fatal(err)
	}
	return meta
}

// dirSize is the bytes of a block directory's index and chunks.
func dirSize(t testing.TB, dir string) int64 {
	t.Helper()
	files, err := block.LocalFiles(dir)
	if err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, f := range files {
		n += f.SizeBytes
	}
	return n
}

func mustULID(t testing.TB, dir string) ulid.ULID {
	t.Helper()
	id, err := ulid.Parse(filepath.Base(dir))
	if err != nil {
		t.Fatal(err)
	}
	return id
}

func quietLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }
