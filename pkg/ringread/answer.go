package ringread

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"unsafe"

	"github.com/prometheus/prometheus/config"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/storage/remote"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
	"google.golang.org/protobuf/encoding/protowire"
)

// answer is one receiver's whole answer to a select: its series in label
// order, each with the encoded chunks it sent, never decoded here. Chunk
// bytes and encoded labels point into the answer's frames (arena).
type answer struct {
	series []answerSeries
	chunks []wireChunk // every series' chunks, one after the other
}

// answerSeries is one series of an answer.
type answerSeries struct {
	// pb is the series' labels as the answer encoded them (its Label
	// fields, tags included): the replicas of a series encode them alike,
	// so comparing these bytes finds a series' replicas without decoding
	// their labels.
	pb []byte
	// lset is decoded from pb on first use (see labelsOf).
	lset    labels.Labels
	decoded bool
	chunks  []wireChunk
}

// wireChunk is one encoded chunk as a receiver sent it, or in a
// ringSeries the place of a cluster of overlapping chunks (see
// dedupChunks).
type wireChunk struct {
	minT, maxT int64
	enc        chunkenc.Encoding
	rep        uint8 // the answer it came from, while merging replicas
	// cluster, when not 0, makes this the span of ringSeries.clusters[
	// cluster-1] (data is nil): chunks of several replicas merged as they
	// are read.
	cluster int32
	data    []byte
}

func (c *wireChunk) equal(o *wireChunk) bool {
	return c.minT == o.minT && c.maxT == o.maxT && c.enc == o.enc && bytes.Equal(c.data, o.data)
}

// Field numbers of the remote-read messages decoded here (prompb's
// remote.proto and types.proto).
const (
	fieldChunkedSeries = 1 // ChunkedReadResponse.chunked_series
	fieldQueryResult   = 1 // ReadResponse.results
	fieldTimeseries    = 1 // QueryResult.timeseries
	fieldSeriesLabels  = 1 // ChunkedSeries.labels, TimeSeries.labels
	fieldSeriesChunks  = 2 // ChunkedSeries.chunks
	fieldLabelName     = 1
	fieldLabelValue    = 2
	fieldChunkMinTime  = 1
	fieldChunkMaxTime  = 2
	fieldChunkType     = 3
	fieldChunkData     = 4
)

var errMalformed = errors.New("malformed remote-read answer")

var bodyReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, answerBufferSize) }}

// readChunkedAnswer reads a streamed remote-read answer
// (STREAMED_XOR_CHUNKS) whole. The receiver sends its series sorted, each
// in one or more consecutive frames (a series with many chunks is split),
// which are joined here. Frames are copied into an arena, and the series
// point into it: nothing is decoded but the protobuf's framing.
func readChunkedAnswer(body io.Reader) (*answer, error) {
	// Read the connection in large pieces, not the chunked reader's 4 KiB
	// (see answerBufferSize).
	br := bodyReaders.Get().(*bufio.Reader)
	br.Reset(body)
	defer func() {
		br.Reset(nil)
		bodyReaders.Put(br)
	}()
	cr := remote.NewChunkedReader(br, config.DefaultChunkedReadLimit, nil)
	var (
		a     answer
		arena arena
	)
	for {
		frame, err := cr.Next()
		if errors.Is(err, io.EOF) {
			return &a, nil
		}
		if err != nil {
			return nil, err
		}
		if err := a.addFrame(arena.copy(frame)); err != nil {
			return nil, err
		}
	}
}

// addFrame adds the series of one ChunkedReadResponse.
func (a *answer) addFrame(b []byte) error {
	return eachField(b, func(num protowire.Number, v []byte) error {
		if num != fieldChunkedSeries {
			return nil // query_index: one query per request
		}
		from := len(a.chunks)
		s, err := decodeSeries(v, &a.chunks)
		if err != nil {
			return err
		}
		// Series share the answer's chunk slice; each its own part, capped,
		// so an append to one never writes into the next.
		s.chunks = a.chunks[from:len(a.chunks):len(a.chunks)]
		if n := len(a.series); n > 0 && bytes.Equal(a.series[n-1].pb, s.pb) {
			a.series[n-1].chunks = append(a.series[n-1].chunks, s.chunks...)
			return nil
		}
		a.series = append(a.series, s)
		return nil
	})
}

// readSamplesAnswer decodes a ReadResponse (the SAMPLES response type,
// already snappy-decoded) of a series-only select: the series, without
// samples, sorted by labels with b (receivers answer samples unsorted).
func readSamplesAnswer(body []byte, b *labelDecoder) (*answer, error) {
	var a answer
	err := eachField(body, func(num protowire.Number, v []byte) error {
		if num != fieldQueryResult {
			return nil
		}
		return eachField(v, func(num protowire.Number, v []byte) error {
			if num != fieldTimeseries {
				return nil
			}
			s, err := decodeSeries(v, nil)
			if err != nil {
				return err
			}
			a.series = append(a.series, s)
			return nil
		})
	})
	if err != nil {
		return nil, err
	}
	for i := range a.series {
		b.labelsOf(&a.series[i])
	}
	slices.SortFunc(a.series, func(x, y answerSeries) int { return labels.Compare(x.lset, y.lset) })
	return &a, nil
}

// decodeSeries decodes a ChunkedSeries (or a TimeSeries, whose labels are
// the same field; its samples are not read) into its label bytes and,
// with chunks, appends its chunks there.
func decodeSeries(b []byte, chunks *[]wireChunk) (answerSeries, error) {
	var s answerSeries
	start, end := -1, -1
	for off := 0; off < len(b); {
		num, typ, n := protowire.ConsumeTag(b[off:])
		if n < 0 {
			return s, errMalformed
		}
		m := protowire.ConsumeFieldValue(num, typ, b[off+n:])
		if m < 0 {
			return s, errMalformed
		}
		switch {
		case num == fieldSeriesLabels:
			if start < 0 {
				start = off
			}
			end = off + n + m
		case num == fieldSeriesChunks && chunks != nil && typ == protowire.BytesType:
			v, _ := protowire.ConsumeBytes(b[off+n:])
			c, err := decodeChunk(v)
			if err != nil {
				return s, err
			}
			*chunks = append(*chunks, c)
		}
		off += n + m
	}
	if start >= 0 {
		s.pb = b[start:end:end]
	}
	return s, nil
}

func decodeChunk(b []byte) (wireChunk, error) {
	var c wireChunk
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return c, errMalformed
		}
		b = b[n:]
		switch {
		case typ == protowire.VarintType:
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return c, errMalformed
			}
			b = b[n:]
			switch num {
			case fieldChunkMinTime:
				c.minT = int64(v)
			case fieldChunkMaxTime:
				c.maxT = int64(v)
			case fieldChunkType:
				c.enc = chunkenc.Encoding(v)
			}
		case num == fieldChunkData && typ == protowire.BytesType:
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return c, errMalformed
			}
			c.data, b = v, b[n:]
		default:
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return c, errMalformed
			}
			b = b[n:]
		}
	}
	if !chunkenc.IsValidEncoding(c.enc) {
		return c, fmt.Errorf("%w: chunk encoding %d", errMalformed, c.enc)
	}
	return c, nil
}

// eachField calls f with each length-delimited field of the message b
// and skips the others.
func eachField(b []byte, f func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errMalformed
		}
		b = b[n:]
		if typ != protowire.BytesType {
			n := protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return errMalformed
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return errMalformed
		}
		if err := f(num, v); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// labelDecoder decodes the labels of answers' series into one symbol
// table per select (with Prometheus' dedupelabels, a builder of its own
// would make a table per series).
type labelDecoder struct {
	b   labels.ScratchBuilder
	err error
}

func newLabelDecoder(syms *labels.SymbolTable) *labelDecoder {
	d := &labelDecoder{b: labels.NewScratchBuilderWithSymbolTable(syms, 16)}
	// The names and values point into the answer's frames: copied.
	d.b.SetUnsafeAdd(true)
	return d
}

// labelsOf returns s's labels, decoding them on first use. A malformed
// label is remembered in d.err (the series then has the labels before it).
func (d *labelDecoder) labelsOf(s *answerSeries) labels.Labels {
	if s.decoded {
		return s.lset
	}
	d.b.Reset()
	err := eachField(s.pb, func(num protowire.Number, v []byte) error {
		if num != fieldSeriesLabels {
			return nil
		}
		var name, value []byte
		err := eachField(v, func(num protowire.Number, v []byte) error {
			switch num {
			case fieldLabelName:
				name = v
			case fieldLabelValue:
				value = v
			}
			return nil
		})
		d.b.Add(yoloString(name), yoloString(value))
		return err
	})
	if err != nil && d.err == nil {
		d.err = err
	}
	d.b.Sort()
	s.lset, s.decoded = d.b.Labels(), true
	return s.lset
}

func yoloString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

// arena holds an answer's frames in few allocations: the reader's buffer
// is reused for the next frame, and the series keep pointing into theirs.
type arena struct{ cur []byte }

const arenaSlab = 64 << 10

func (a *arena) copy(b []byte) []byte {
	if len(b) > cap(a.cur)-len(a.cur) {
		if len(b) > arenaSlab/4 {
			return bytes.Clone(b)
		}
		a.cur = make([]byte, 0, arenaSlab)
	}
	n := len(a.cur)
	a.cur = append(a.cur, b...)
	return a.cur[n:len(a.cur):len(a.cur)]
}
