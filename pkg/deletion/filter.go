package deletion

import (
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/tombstones"
	"github.com/prometheus/prometheus/util/annotations"
)

// Filter applies requests to a series set read from blocks that still hold
// deleted samples: a series that matches a request loses the samples in the
// request's range, and a series left with no sample is not returned at all
// (as the TSDB's querier leaves out a series wholly tombstoned). Series that
// match no request pass untouched (their iterators are the source's own).
// reqs empty: ss itself.
func Filter(ss storage.SeriesSet, reqs []*Request) storage.SeriesSet {
	if len(reqs) == 0 {
		return ss
	}
	return &filtered{SeriesSet: ss, reqs: reqs}
}

type filtered struct {
	storage.SeriesSet
	reqs []*Request
	cur  storage.Series
	it   chunkenc.Iterator
	err  error
}

func (f *filtered) Next() bool {
	for f.SeriesSet.Next() {
		s := f.SeriesSet.At()
		iv := Intervals(f.reqs, s.Labels())
		if len(iv) == 0 {
			f.cur = s
			return true
		}
		ds := &deletedSeries{Series: s, iv: iv}
		f.it = ds.Iterator(f.it)
		if f.it.Next() == chunkenc.ValNone {
			if err := f.it.Err(); err != nil {
				f.err = err
				return false
			}
			continue // every sample of it deleted
		}
		f.cur = ds
		return true
	}
	return false
}

func (f *filtered) At() storage.Series { return f.cur }

func (f *filtered) Err() error {
	if f.err != nil {
		return f.err
	}
	return f.SeriesSet.Err()
}

func (f *filtered) Warnings() annotations.Annotations { return f.SeriesSet.Warnings() }

// deletedSeries is a series seen without its deleted intervals.
type deletedSeries struct {
	storage.Series
	iv tombstones.Intervals
}

func (s *deletedSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	var inner chunkenc.Iterator
	if d, ok := it.(*tsdb.DeletedIterator); ok {
		inner = d.Iter
	}
	return &tsdb.DeletedIterator{Iter: s.Series.Iterator(inner), Intervals: s.iv}
}
