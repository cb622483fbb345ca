package receivers

import (
	"bytes"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/prompb"
	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"

	"github.com/gpustore/gpustore/pkg/seriesset"
)

// receivedSeries is one series as one receiver streamed it: the frames it
// arrived in (a series with many chunks is split over several, each a
// series of the remote-read client). Its labels are decoded once: the
// client's series build them from protobuf at every call, and the merge
// compares them often.
type receivedSeries struct {
	lset  labels.Labels
	parts []storage.Series
}

func (s *receivedSeries) Labels() labels.Labels { return s.lset }

func (s *receivedSeries) Iterator(it chunkenc.Iterator) chunkenc.Iterator {
	if len(s.parts) == 1 {
		return s.parts[0].Iterator(it)
	}
	// Frames follow each other in time: the chain never has to merge.
	return seriesset.ChainSampleIterator(it, s.parts)
}

// encodedChunks is what the remote-read client's streamed series expose of
// their protobuf: the encoded chunks as the receiver sent them.
type encodedChunks interface {
	GetChunks() []prompb.Chunk
}

// sameChunks reports whether a and b hold the same encoded chunks. Replicas
// of a series that received the same writes in the same order cut the same
// chunks byte for byte (the head cuts by sample count and time alone), so
// this is the usual case. It is false when either cannot show its chunks
// (a samples answer): those are merged sample by sample.
func sameChunks(a, b *receivedSeries) bool {
	var ca, cb []prompb.Chunk
	for _, p := range a.parts {
		e, ok := p.(encodedChunks)
		if !ok {
			return false
		}
		ca = append(ca, e.GetChunks()...)
	}
	for _, p := range b.parts {
		e, ok := p.(encodedChunks)
		if !ok {
			return false
		}
		cb = append(cb, e.GetChunks()...)
	}
	if len(ca) != len(cb) {
		return false
	}
	for i := range ca {
		x, y := &ca[i], &cb[i]
		if x.MinTimeMs != y.MinTimeMs || x.MaxTimeMs != y.MaxTimeMs || x.Type != y.Type || !bytes.Equal(x.Data, y.Data) {
			return false
		}
	}
	return true
}

// mergeReplicas is the merge of one series that several receivers answered
// (a storage.VerticalSeriesMergeFunc). Replicas with the same chunks are
// read once; the others (a receiver that missed a write, or is one sample
// ahead in its open head chunk) are merged sample by sample with
// storage.ChainedSeriesMerge, identical timestamps kept once. Comparing
// chunk bytes costs far less than decoding every replica and merging them
// sample by sample, which was most of a fan-out read's CPU.
func (s *Source) mergeReplicas(series ...storage.Series) storage.Series {
	distinct := make([]storage.Series, 0, len(series))
next:
	for _, x := range series {
		rx, ok := x.(*receivedSeries)
		if ok {
			for _, d := range distinct {
				if rd, ok := d.(*receivedSeries); ok && sameChunks(rx, rd) {
					s.replicas.identical.Inc()
					continue next
				}
			}
		}
		distinct = append(distinct, x)
	}
	if len(distinct) == 1 {
		return distinct[0]
	}
	s.replicas.merged.Add(float64(len(distinct)))
	return seriesset.ChainedSeriesMerge(distinct...)
}
