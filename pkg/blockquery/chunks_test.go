package blockquery

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
)

// TestChunkQuerierSameAsTSDB: a whole-chunk select (a ring receiver's
// remote read) returns the series and stored chunks the TSDB's block chunk
// querier returns, byte for byte, cold and from the cache; other selects
// are the TSDB's own.
func TestChunkQuerierSameAsTSDB(t *testing.T) {
	ctx := context.Background()
	cache := NewCache(64<<20, nil)
	dump := func(ss storage.ChunkSeriesSet) string {
		var sb strings.Builder
		for ss.Next() {
			s := ss.At()
			fmt.Fprintf(&sb, "%s:", s.Labels())
			it := s.Iterator(nil)
			for it.Next() {
				m := it.At()
				fmt.Fprintf(&sb, " [%d %d %s %x]", m.MinTime, m.MaxTime, m.Chunk.Encoding(), m.Chunk.Bytes())
			}
			if err := it.Err(); err != nil {
				t.Fatal(err)
			}
			sb.WriteString("\n")
		}
		if err := ss.Err(); err != nil {
			t.Fatal(err)
		}
		return sb.String()
	}
	nonEmpty := 0
	for seed := range uint64(4) {
		rnd := rand.New(rand.NewPCG(seed, 43))
		b := testBlock(t, rnd)
		m := b.Meta()
		for round := range 30 {
			mint := m.MinTime + rnd.Int64N(m.MaxTime-m.MinTime)
			maxt := mint + rnd.Int64N(m.MaxTime-mint)
			hints := &storage.SelectHints{Start: mint, End: maxt, DisableTrimming: rnd.IntN(4) > 0}
			ms := testSelectors[rnd.IntN(len(testSelectors))]
			want, err := tsdb.NewBlockChunkQuerier(b, mint, maxt)
			if err != nil {
				t.Fatal(err)
			}
			got, err := NewChunkQuerier(b, cache, mint, maxt, Options{Key: m.ULID.String()})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = want.Close(); _ = got.Close() })
			w := dump(want.Select(ctx, true, hints, ms...))
			if hints.DisableTrimming && w != "" {
				nonEmpty++
			}
			for pass := range 2 {
				if g := dump(got.Select(ctx, true, hints, ms...)); g != w {
					t.Fatalf("seed %d round %d pass %d, %v hints %+v:\ngot  %.2000s\nwant %.2000s", seed, round, pass, ms, hints, g, w)
				}
			}
		}
	}
	if nonEmpty < 20 {
		t.Fatalf("%d whole-chunk selects found chunks", nonEmpty)
	}
}
