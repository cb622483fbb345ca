package ringread

import (
	"bytes"
	"cmp"
	"slices"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"github.com/prometheus/prometheus/tsdb/chunks"
	"github.com/prometheus/prometheus/util/annotations"
)

// replicaSet merges the receivers' answers to one select into one series
// set in label order: a series that several receivers sent (its replicas)
// comes out once. Replicas are told apart by their encoded labels, and
// their chunks are compared encoded (dedupChunks): a chunk every replica
// sent byte for byte is kept once and never decoded here, and only chunks
// that differ (a replica that missed a write, or is a sample ahead in its
// open head chunk) are decoded and merged sample by sample.
type replicaSet struct {
	answers    []*answer
	next       []int // each answer's next series
	dec        *labelDecoder
	mint, maxt int64
	reps       []*answerSeries // scratch: the current series' replicas
	cur        *ringSeries
	stats      replicaStats
	report     func(replicaStats) // at the end, once
	ws         annotations.Annotations
	err        error
}

// replicaStats count what the merge of one select did.
type replicaStats struct {
	// Replica answers of a series skipped whole (every chunk identical to
	// another replica's), and of series that needed a merge somewhere.
	identicalSeries, mergedSeries int
	// Chunks of replicas dropped as identical to another replica's chunk,
	// and chunks decoded and merged sample by sample.
	identicalChunks, mergedChunks int
}

func newReplicaSet(answers []*answer, dec *labelDecoder, mint, maxt int64, ws annotations.Annotations, report func(replicaStats)) *replicaSet {
	return &replicaSet{answers: answers, next: make([]int, len(answers)), dec: dec, mint: mint, maxt: maxt, ws: ws, report: report}
}

func (s *replicaSet) Next() bool {
	if s.err != nil || s.answers == nil {
		return false
	}
	s.reps = s.reps[:0]
	var low *answerSeries // the lowest labels among the answers' next series
	for i, a := range s.answers {
		if s.next[i] >= len(a.series) {
			continue
		}
		x := &a.series[s.next[i]]
		switch {
		case low == nil:
		case bytes.Equal(x.pb, low.pb):
			s.reps = append(s.reps, x)
			continue
		default:
			c := labels.Compare(s.dec.labelsOf(x), s.dec.labelsOf(low))
			if c > 0 {
				continue
			}
			if c == 0 {
				s.reps = append(s.reps, x)
				continue
			}
		}
		low = x
		s.reps = append(s.reps[:0], x)
	}
	if low == nil {
		s.finish()
		return false
	}
	for i, a := range s.answers { // past the replicas just taken
		if s.next[i] < len(a.series) && slices.Contains(s.reps, &a.series[s.next[i]]) {
			s.next[i]++
		}
	}
	chks, clusters := dedupChunks(s.reps, &s.stats)
	lset := s.dec.labelsOf(low)
	if s.dec.err != nil {
		s.err = s.dec.err
		s.finish()
		return false
	}
	s.cur = &ringSeries{lset: lset, chunks: chks, clusters: clusters, mint: s.mint, maxt: s.maxt}
	return true
}

// finish reports the stats once and lets the answers go.
func (s *replicaSet) finish() {
	if s.report != nil {
		s.report(s.stats)
		s.report = nil
	}
	s.answers = nil
}

func (s *replicaSet) At() storage.Series                { return s.cur }
func (s *replicaSet) current() *ringSeries              { return s.cur }
func (s *replicaSet) Err() error                        { return s.err }
func (s *replicaSet) Warnings() annotations.Annotations { return s.ws }

// dedupChunks returns the chunks of one series from its replicas' answers
// in time order, not overlapping: when every replica sent the same chunks
// (the usual case: replicas that took the same writes cut the same
// chunks), one replica's, as sent. Otherwise each chunk that several
// replicas sent byte for byte once, and where chunks overlap in time
// (they differ: a replica missed a write, or cut its chunks elsewhere
// since), a cluster: each replica's run of chunks there, merged sample by
// sample when the series is read (never encoded again).
func dedupChunks(reps []*answerSeries, st *replicaStats) ([]wireChunk, [][][]wireChunk) {
	first := reps[0].chunks
	if allSame(reps) && disjoint(first) {
		st.identicalSeries += len(reps) - 1
		st.identicalChunks += (len(reps) - 1) * len(first)
		return first, nil
	}
	var all []wireChunk
	for i, r := range reps {
		for _, c := range r.chunks {
			c.rep = uint8(min(i, 255))
			all = append(all, c)
		}
	}
	slices.SortStableFunc(all, func(a, b wireChunk) int {
		return cmp.Or(cmp.Compare(a.minT, b.minT), cmp.Compare(a.maxT, b.maxT))
	})
	kept := make([]wireChunk, 0, len(all))
	for _, c := range all {
		dup := false
		// Identical chunks start at the same time: look back among those.
		for k := len(kept) - 1; k >= 0 && kept[k].minT == c.minT; k-- {
			if kept[k].equal(&c) {
				dup = true
				break
			}
		}
		if dup {
			st.identicalChunks++
			continue
		}
		kept = append(kept, c)
	}
	out := make([]wireChunk, 0, len(kept))
	var clusters [][][]wireChunk
	for i := 0; i < len(kept); {
		j, hi := i+1, kept[i].maxT
		for j < len(kept) && kept[j].minT <= hi {
			hi = max(hi, kept[j].maxT)
			j++
		}
		if j == i+1 {
			out = append(out, kept[i])
			i = j
			continue
		}
		clusters = append(clusters, runs(kept[i:j]))
		out = append(out, wireChunk{minT: kept[i].minT, maxT: hi, cluster: int32(len(clusters))})
		st.mergedChunks += j - i
		i = j
	}
	if clusters != nil {
		st.mergedSeries += len(reps)
	} else {
		st.identicalSeries += len(reps) - 1
	}
	return out, clusters
}

// runs splits a cluster's chunks (in time order) into each replica's run
// of chunks, which follow each other without overlapping, so that the
// merge compares a few runs at each sample rather than every chunk; a
// chunk that overlaps its own replica's previous one (never sent by a
// TSDB) makes a run of its own.
func runs(cs []wireChunk) [][]wireChunk {
	var out [][]wireChunk
	last := map[uint8]int{} // replica → its open run
	for _, c := range cs {
		if k, ok := last[c.rep]; ok {
			if r := out[k]; r[len(r)-1].maxT < c.minT {
				out[k] = append(r, c)
				continue
			}
		}
		last[c.rep] = len(out)
		out = append(out, []wireChunk{c})
	}
	return out
}

// allSame reports whether every replica sent the same chunks.
func allSame(reps []*answerSeries) bool {
	first := reps[0].chunks
	for _, r := range reps[1:] {
		if len(r.chunks) != len(first) {
			return false
		}
		for i := range first {
			if !first[i].equal(&r.chunks[i]) {
				return false
			}
		}
	}
	return true
}

// disjoint reports whether cs are in time order without overlaps (a
// receiver's own chunks of a series always are: its TSDB merges what
// overlaps).
func disjoint(cs []wireChunk) bool {
	for i := 1; i < len(cs); i++ {
		if cs[i].minT <= cs[i-1].maxT {
			return false
		}
	}
	return true
}

// ringSeries is one series read from the receivers: its chunks (and
// clusters of replicas' differing chunks), decoded as they are iterated,
// cut to the select's range.
type ringSeries struct {
	lset       labels.Labels
	chunks     []wireChunk
	clusters   [][][]wireChunk
	mint, maxt int64
}

func (s *ringSeries) Labels() labels.Labels { return s.lset }

func (s *ringSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	ci, ok := it.(*chunksIterator)
	if !ok {
		ci = &chunksIterator{}
	}
	ci.reset(s, s.mint, s.maxt)
	return ci
}

// ringSeriesSet is a set of series read from the receivers.
type ringSeriesSet interface {
	storage.SeriesSet
	current() *ringSeries
}

// sliceSet is a slice's part of a select merged for every slice of a
// sliced range query: the series cut to the slice's range.
type sliceSet struct {
	m          *mergedSelect
	i          int
	cur        *ringSeries
	mint, maxt int64
}

func (s *sliceSet) Next() bool {
	s.i++
	if s.i >= len(s.m.series) {
		return false
	}
	c := *s.m.series[s.i]
	c.mint, c.maxt = s.mint, s.maxt
	s.cur = &c
	return true
}

func (s *sliceSet) At() storage.Series                { return s.cur }
func (s *sliceSet) current() *ringSeries              { return s.cur }
func (*sliceSet) Err() error                          { return nil }
func (s *sliceSet) Warnings() annotations.Annotations { return s.m.warnings }

// chunkSet is a set of series read from the receivers as chunk series
// (remote read through this process).
type chunkSet struct{ ringSeriesSet }

func (s chunkSet) At() storage.ChunkSeries { return ringChunkSeries{s.current()} }

type ringChunkSeries struct{ s *ringSeries }

func (c ringChunkSeries) Labels() labels.Labels { return c.s.lset }

// Iterator returns the chunks as received, but for those reaching out of
// the select's range (receivers send them whole), which are cut to it and
// encoded again, as a TSDB's chunk querier cuts them, and the clusters of
// replicas' differing chunks, merged and encoded.
func (c ringChunkSeries) Iterator(chunks.Iterator) chunks.Iterator {
	s := c.s
	metas := make([]chunks.Meta, 0, len(s.chunks))
	for i, w := range s.chunks {
		if w.cluster == 0 && w.minT >= s.mint && w.maxT <= s.maxt {
			chk, err := chunkenc.FromData(w.enc, w.data)
			if err != nil {
				return errChunksIterator{err}
			}
			metas = append(metas, chunks.Meta{MinTime: w.minT, MaxTime: w.maxT, Chunk: chk})
			continue
		}
		if w.maxT < s.mint || w.minT > s.maxt {
			continue
		}
		// Cut to the range, or a cluster's chunks merged.
		cut := storage.NewSeriesToChunkEncoder(&ringSeries{chunks: s.chunks[i : i+1], clusters: s.clusters, mint: s.mint, maxt: s.maxt}).Iterator(nil)
		for cut.Next() {
			metas = append(metas, cut.At())
		}
		if err := cut.Err(); err != nil {
			return errChunksIterator{err}
		}
	}
	return storage.NewListChunkSeriesIterator(metas...)
}

type errChunksIterator struct{ err error }

func (errChunksIterator) At() chunks.Meta { return chunks.Meta{} }
func (errChunksIterator) Next() bool      { return false }
func (e errChunksIterator) Err() error    { return e.err }
