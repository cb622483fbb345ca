package seriesset

import (
	"fmt"
	"slices"
	"testing"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/util/annotations"
)

// countingSet is a sorted series set whose At builds a new series at every
// call, as the TSDB's block series set does, and counts the calls and the
// positions (Next returning true).
type countingSet struct {
	series     []promql.Series
	i          int
	ats, nexts *int
}

func (s *countingSet) Next() bool {
	s.i++
	if s.i < len(s.series) {
		*s.nexts++
		return true
	}
	return false
}

func (s *countingSet) At() storage.Series {
	*s.ats++
	return promql.NewStorageSeries(s.series[s.i])
}
func (s *countingSet) Err() error                        { return nil }
func (s *countingSet) Warnings() annotations.Annotations { return nil }

// leaves returns n sorted sets of series g0..g9: set k leaves out the
// series whose number is a multiple of k+2 and holds samples at k*10+0..4,
// so that series meet in several sets and their samples interleave.
func leaves(n int, ats, nexts *int) []storage.SeriesSet {
	out := make([]storage.SeriesSet, n)
	for k := range n {
		var ss []promql.Series
		for g := range 10 {
			if g%(k+2) == 0 {
				continue
			}
			s := promql.Series{Metric: labels.FromStrings("__name__", fmt.Sprintf("g%d", g))}
			for j := range 5 {
				t := int64(k*10 + j)
				s.Floats = append(s.Floats, promql.FPoint{T: t, F: float64(g*1000) + float64(t)})
			}
			ss = append(ss, s)
		}
		out[k] = &countingSet{series: ss, i: -1, ats: ats, nexts: nexts}
	}
	return out
}

func read(t *testing.T, s storage.SeriesSet) map[string][]promql.FPoint {
	t.Helper()
	out := map[string][]promql.FPoint{}
	var order []string
	for s.Next() {
		k := s.At().Labels().String()
		it := s.At().Iterator(nil)
		for it.Next() == chunkenc.ValFloat {
			ts, v := it.At()
			out[k] = append(out[k], promql.FPoint{T: ts, F: v})
		}
		order = append(order, k)
	}
	if err := s.Err(); err != nil {
		t.Fatal(err)
	}
	if !slices.IsSorted(order) {
		t.Errorf("series out of order: %v", order)
	}
	return out
}

func TestMergeBuildsEachSeriesOnce(t *testing.T) {
	// A merge of merges, as the query path nests them (the local TSDB's
	// blocks beside the bucket store's), with Prometheus' merge alone and
	// with the wrappers.
	var plainAts, plainNexts, ats, nexts int
	pl := leaves(4, &plainAts, &plainNexts)
	plain := storage.NewMergeSeriesSet([]storage.SeriesSet{
		storage.NewMergeSeriesSet(pl[:3], 0, storage.ChainedSeriesMerge), pl[3],
	}, 0, storage.ChainedSeriesMerge)
	ml := leaves(4, &ats, &nexts)
	memo := NewMergeSeriesSet([]storage.SeriesSet{
		NewMergeSeriesSet(ml[:3], storage.ChainedSeriesMerge), ml[3],
	}, storage.ChainedSeriesMerge)

	want, got := read(t, plain), read(t, memo)
	if len(want) != 9 || fmt.Sprint(want) != fmt.Sprint(got) {
		t.Fatalf("merged series differ:\nwant %v\n got %v", want, got)
	}
	if ats != nexts {
		t.Errorf("leaf series built %d times for %d positions, want once each (Prometheus' merge alone: %d)", ats, nexts, plainAts)
	}
	if plainAts <= plainNexts {
		t.Errorf("Prometheus' merge built leaf series only %d times for %d positions: the test no longer shows what it guards", plainAts, plainNexts)
	}
	t.Logf("leaf series built: %d wrapped, %d unwrapped, for %d positions", ats, plainAts, nexts)
}

func TestMergeQuerierOfOne(t *testing.T) {
	q := storage.NoopQuerier()
	if got := NewMergeQuerier([]storage.Querier{q}, storage.ChainedSeriesMerge); got != q {
		t.Errorf("a merge of one querier is %T, want the querier itself", got)
	}
}
