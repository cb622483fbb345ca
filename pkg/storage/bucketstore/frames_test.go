package bucketstore

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/index"
	"github.com/thanos-io/objstore"

	"github.com/gpustore/gpustore/pkg/block"
)

// rangeCounter counts the bytes range requests read, by object suffix.
type rangeCounter struct {
	objstore.Bucket
	mtx   sync.Mutex
	bytes map[string]int64
}

func (b *rangeCounter) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	b.mtx.Lock()
	b.bytes[name[strings.LastIndex(name, "/")+1:]] += length
	b.mtx.Unlock()
	return b.Bucket.GetRange(ctx, name, off, length)
}

// manySeries is metrics GPU metrics of 8 GPUs on nodes nodes: an index
// mostly of series entries (few label values), as a GPU cluster's.
func manySeries(metrics, nodes int) []labels.Labels {
	var out []labels.Labels
	for m := range metrics {
		for n := range nodes {
			for g := range 8 {
				out = append(out, labels.FromStrings("__name__", fmt.Sprintf("DCGM_FI_DEV_%02d", m), "Hostname", fmt.Sprintf("node-%03d", n),
					"gpu", fmt.Sprint(g), "modelName", "NVIDIA H100 80GB HBM3"))
			}
		}
	}
	return out
}

// seriesSectionLen is the size of the series section of the block's index.
func seriesSectionLen(t *testing.T, dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, block.IndexFilename))
	if err != nil {
		t.Fatal(err)
	}
	toc, err := index.NewTOCFromByteSlice(byteSlice(b[len(b)-indexTOCLen:]))
	if err != nil {
		t.Fatal(err)
	}
	return int64(toc.LabelIndices - toc.Series)
}

// TestColdSeriesReadDecodesItsSection: the first read of one series from
// a zstd-encoded block (the page cache empty, as on a dashboard's first
// view) fetches and decodes the index's symbols, postings and tables and
// the frame of the series section that holds the series, not the whole
// index. The whole index in one frame (what an index under 8 MiB was)
// cost a cold 30-day overview 1.4× the time of plain files.
func TestColdSeriesReadDecodesItsSection(t *testing.T) {
	ctx := context.Background()
	dir := writeBlock(t, t.TempDir(), manySeries(60, 100), 0, 2*minute, 15_000)
	bkt := &rangeCounter{Bucket: objstore.NewInMemBucket(), bytes: map[string]int64{}}
	m := uploadEncodedBlock(t, bkt, "t", dir, block.EncodingZstdNoCRC)
	f, _ := m.File(block.IndexFilename)
	s := newTestStore(t, bkt, 32<<10, 64<<20)
	q := mustQuerier(t, s, "t", 0, 2*minute, nil)
	if q == nil {
		t.Fatal("no querier")
	}
	defer q.Close()
	ss := q.Select(ctx, false, nil, labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_17"), labels.MustNewMatcher(labels.MatchEqual, "Hostname", "node-042"), labels.MustNewMatcher(labels.MatchEqual, "gpu", "3"))
	n := 0
	for ss.Next() {
		n++
		it := ss.At().Iterator(nil)
		for it.Next() != 0 {
		}
	}
	if ss.Err() != nil || n != 1 {
		t.Fatalf("%d series, %v", n, ss.Err())
	}
	// The index's bytes the cache holds: what was decoded.
	name, cached := block.ObjectName("t", m.ULID, f.ObjectRel()), int64(0)
	s.cache.mtx.Lock()
	for k, e := range s.cache.pages {
		if k.object == name {
			cached += int64(len(e.Value.(*page).data))
		}
	}
	s.cache.mtx.Unlock()
	series := seriesSectionLen(t, dir)
	t.Logf("index of %d bytes (series section %d) stored in %d bytes, %d frames; a cold read of one series decoded %d bytes of it",
		f.SizeBytes, series, f.StoredBytes, f.Frames, cached)
	if cached > f.SizeBytes-series/2 {
		t.Errorf("a cold read of one series decoded %d of the index's %d bytes: most of its series section (%d bytes)", cached, f.SizeBytes, series)
	}
}

// TestColdMetricReadWritesOnlyItsChunks: a cold query of one metric over a
// block whose chunk segment is stored zstd-columns writes again exactly the
// chunks it reads. The series are a GPU cluster's (Hostname sorts before
// __name__), so the metric's chunks lie in every GPU's stretch of the
// segment: decoding the frames under the pages read, as before, wrote every
// chunk of every stretch again (1.7-1.9× a plain block's CPU on a cold 24 h
// view of a 512-GPU day, bench/RESULTS.md).
func TestColdMetricReadWritesOnlyItsChunks(t *testing.T) {
	ctx := context.Background()
	series := manySeries(20, 8)
	dir := writeBlock(t, t.TempDir(), series, 0, 2*hour, 15_000)
	bm, err := block.ReadLocalMeta(dir)
	if err != nil {
		t.Fatal(err)
	}
	meta := block.Meta{BlockMeta: bm, GPUStore: block.GPUStoreMeta{Version: block.MetaVersion, Tenant: "t", Labels: map[string]string{}, Source: block.SourceReceive}}
	bkt := objstore.NewInMemBucket()
	if err := block.UploadEncoded(ctx, bkt, dir, &meta, block.Encodings{Chunks: block.EncodingZstdColumns, Index: block.EncodingNone}); err != nil {
		t.Fatal(err)
	}
	seg, _ := meta.File("chunks/000001")
	if seg.Encoding != block.EncodingZstdColumns || seg.Frames < 8 {
		t.Fatalf("segment stored %s in %d frames", seg.Encoding, seg.Frames)
	}
	metric := labels.MustNewMatcher(labels.MatchEqual, "__name__", "DCGM_FI_DEV_07")
	want := localChunkBytes(t, dir, metric)

	query := func(s *Store, round int) {
		t.Helper()
		q := mustQuerier(t, s, "t", 0, 2*hour, nil)
		defer q.Close()
		ss := q.Select(ctx, false, nil, metric)
		n, samples := 0, 0
		for ss.Next() {
			n++
			it := ss.At().Iterator(nil)
			for it.Next() != 0 {
				samples++
			}
		}
		if ss.Err() != nil || n != 64 || samples != 64*480 {
			t.Fatalf("round %d: %d series, %d samples: %v", round, n, samples, ss.Err())
		}
	}
	s := newTestStore(t, bkt, 32<<10, 256<<20)
	for round := range 2 { // the second, warm: nothing written again
		query(s, round)
		st := s.cache.Stats()
		if st.DecodedBytes != want {
			t.Fatalf("round %d: a query of one metric wrote %d bytes of chunks again, want its chunks' %d (the segment holds %d)", round, st.DecodedBytes, want, seg.SizeBytes)
		}
		// The frames' budget share counts the chunks written back.
		if st.Bytes < want || st.Bytes > st.MaxBytes {
			t.Fatalf("round %d: the cache holds %d bytes by its count, with %d of chunks written back, budget %d", round, st.Bytes, want, st.MaxBytes)
		}
	}
	// A budget of a few frames: frames evicted as chunks are written back
	// into them, answers the same.
	small := newTestStore(t, bkt, 32<<10, 40<<10)
	query(small, 0)
	if st := small.cache.Stats(); st.Bytes > st.MaxBytes || st.Evictions == 0 {
		t.Fatalf("a budget of %d: the cache holds %d bytes by its count after %d evictions", st.MaxBytes, st.Bytes, st.Evictions)
	}
}

// localChunkBytes is the bytes of the chunks of the series m selects in the
// local block dir.
func localChunkBytes(t *testing.T, dir string, m *labels.Matcher) int64 {
	b, err := tsdb.OpenBlock(nil, dir, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	q, err := tsdb.NewBlockChunkQuerier(b, 0, math.MaxInt64)
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	var n int64
	ss := q.Select(context.Background(), false, nil, m)
	for ss.Next() {
		it := ss.At().Iterator(nil)
		for it.Next() {
			n += int64(len(it.At().Chunk.Bytes()))
		}
	}
	if ss.Err() != nil {
		t.Fatal(ss.Err())
	}
	return n
}
