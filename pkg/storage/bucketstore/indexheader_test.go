package bucketstore

import (
	"context"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb/index"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
)

// headerSeries are DCGM exporter label sets as a cluster sends them, MIG
// instances included, with enough values per label (UUIDs, hosts, pods) to
// cross the index's 32-entry sampling many times, and values that sort
// around the sampled ones (empty, a prefix of another, non-ASCII).
func headerSeries(nodes int) []labels.Labels {
	var out []labels.Labels
	for _, metric := range []string{"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_PROF_GR_ENGINE_ACTIVE"} {
		for n := 0; n < nodes; n++ {
			for g := 0; g < 8; g++ {
				ls := []string{
					"__name__", metric,
					"Hostname", fmt.Sprintf("node-%03d", n),
					"gpu", fmt.Sprint(g),
					"UUID", fmt.Sprintf("GPU-%08x-%04x-%04x", n*8+g, n, g),
					"modelName", "NVIDIA H100 80GB HBM3",
					"pod", fmt.Sprintf("train-%d-%d", n%5, g),
					"namespace", "ml",
				}
				if g >= 6 { // MIG slices on the last two GPUs
					ls = append(ls, "GPU_I_ID", fmt.Sprint(g-5), "GPU_I_PROFILE", "1g.10gb")
				}
				out = append(out, labels.FromStrings(ls...))
			}
		}
	}
	return append(out,
		labels.FromStrings("__name__", "up", "job", "a"),
		labels.FromStrings("__name__", "up", "job", "aa", "extra", "é"),
		labels.FromStrings("__name__", "up", "job", "zzz", "extra", "z"),
	)
}

// TestIndexHeaderMatchesPrometheusReader: the index header of a block in the
// bucket answers what Prometheus' own index reader (index.NewFileReader)
// answers on the same block: the format version, the label names, every
// symbol by reference, every label's values with their postings, and the
// postings offsets of values asked for in any order, present or not.
func TestIndexHeaderMatchesPrometheusReader(t *testing.T) {
	ctx := context.Background()
	dir := writeBlock(t, t.TempDir(), headerSeries(40), 0, 3_600_000, 300_000)
	want, err := index.NewFileReader(filepath.Join(dir, block.IndexFilename), index.DecodePostingsRaw)
	if err != nil {
		t.Fatal(err)
	}
	defer want.Close()

	for _, enc := range []string{block.EncodingNone, block.EncodingZstd} {
		t.Run("encoding="+enc, func(t *testing.T) {
			bkt := objstore.NewInMemBucket()
			meta := uploadEncodedBlock(t, bkt, "t", dir, enc)
			blk, err := newBucketBlock(bkt, NewPageCache(4<<10, 64<<20), 2, &meta)
			if err != nil {
				t.Fatal(err)
			}
			ir, err := newView(ctx, blk, 0, 3_600_000).Index()
			if err != nil {
				t.Fatal(err)
			}
			rd := ir.(*indexReader)
			compareHeader(t, ctx, rd.h, rd, want)
		})
	}
}

func compareHeader(t *testing.T, ctx context.Context, h indexHeaderReader, rd *indexReader, want *index.Reader) {
	t.Helper()
	if h.IndexVersion() != want.Version() {
		t.Fatalf("version %d, want %d", h.IndexVersion(), want.Version())
	}
	names, err := want.LabelNames(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(h.LabelNames(), names) {
		t.Fatalf("label names %q, want %q", h.LabelNames(), names)
	}
	// Symbols: references are positions in the table (format v2).
	var syms []string
	for it := want.Symbols(); it.Next(); {
		syms = append(syms, it.At())
	}
	if _, _, n := h.SymbolTable(); n != len(syms) {
		t.Fatalf("%d symbols, want %d", n, len(syms))
	}
	for i := len(syms) - 1; i >= 0; i-- { // backwards: no help from a sequential read
		got, err := h.LookupSymbol(rd, uint32(i))
		if err != nil || got != syms[i] {
			t.Fatalf("symbol %d: %q (%v), want %q", i, got, err, syms[i])
		}
	}
	if _, err := h.LookupSymbol(rd, uint32(len(syms))); err == nil {
		t.Fatal("a reference past the table resolved")
	}
	rnd := rand.New(rand.NewPCG(1, 2))
	for _, name := range append(names, "no_such_label") {
		values, err := want.SortedLabelValues(ctx, name, nil)
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		err = h.LabelValues(ctx, rd, name, func(v []byte, off int64) (bool, error) {
			got = append(got, string(v))
			return true, comparePostings(ctx, rd, off, want, name, string(v))
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, values) {
			t.Fatalf("values of %s: %q, want %q", name, got, values)
		}
		// A random sorted subset, with values the block lacks around them.
		var ask []string
		for _, v := range values {
			if rnd.IntN(4) == 0 {
				ask = append(ask, v)
			}
			if rnd.IntN(8) == 0 {
				ask = append(ask, v+"\x00missing")
			}
		}
		ask = append(ask, "", "\xff")
		slices.Sort(ask)
		var found []string
		err = h.PostingsOffsets(ctx, rd, name, ask, func(i int, off int64) error {
			found = append(found, ask[i])
			return comparePostings(ctx, rd, off, want, name, ask[i])
		})
		if err != nil {
			t.Fatal(err)
		}
		wantFound := slices.DeleteFunc(slices.Clone(ask), func(v string) bool { return !slices.Contains(values, v) })
		if !slices.Equal(found, wantFound) {
			t.Fatalf("offsets of %s: found %q of %q, want %q", name, found, ask, wantFound)
		}
	}
}

// comparePostings checks the postings list at off against Prometheus'
// postings of name=value.
func comparePostings(ctx context.Context, rd *indexReader, off int64, want *index.Reader, name, value string) error {
	p, err := rd.postingsAt(off)
	if err != nil {
		return err
	}
	got, err := index.ExpandPostings(p)
	if err != nil {
		return err
	}
	wp, err := want.Postings(ctx, name, value)
	if err != nil {
		return err
	}
	exp, err := index.ExpandPostings(wp)
	if err != nil {
		return err
	}
	if !slices.Equal(got, exp) {
		return fmt.Errorf("postings of %s=%q: %v, want %v", name, value, got, exp)
	}
	return nil
}
