package gpusim

import (
	"encoding/binary"
	"math"
	"slices"
	"strings"

	"github.com/golang/snappy"
)

// Remote-write bodies are encoded by hand, straight from []Series into one
// reused buffer: no intermediate prompb/writev2 structs, no per-series
// allocation. Tests decode the bodies with prompb and writev2 to prove the
// wire format. Field numbers:
//
//	1.0 prometheus.WriteRequest: timeseries=1 {labels=1 {name=1 value=2}, samples=2 {value=1 (double), timestamp=2}}, metadata=3 {type=1 name=2 help=4 unit=5}
//	2.0 io.prometheus.write.v2.Request: symbols=4, timeseries=5 {labels_refs=1 (packed), samples=2, metadata=5 {type=1 help_ref=3 unit_ref=4}}

// Content types and protocol version headers, as Prometheus v0.316.0 sends them.
const (
	ContentTypeV1   = "application/x-protobuf"
	ContentTypeV2   = "application/x-protobuf;proto=io.prometheus.write.v2.Request"
	VersionHeaderV1 = "0.1.0"
	VersionHeaderV2 = "2.0.0"
)

// Encoder turns series into snappy-compressed remote-write bodies. It keeps
// its buffers between calls; the returned body is valid until the next call.
// An Encoder is not safe for concurrent use: give each sender shard its own.
type Encoder struct {
	external []Label
	pb       []byte
	out      []byte
	syms     map[string]uint32
	symList  []string
	refs     []uint32
	ends     []int32
	helpRef  [numFamilies]uint32
	helpSet  [numFamilies]bool
}

// NewEncoder returns an Encoder adding the given external labels (the
// replica's `cluster` and `__replica__`) to every series. A series' own
// label wins over an external label of the same name, as in Prometheus.
func NewEncoder(external []Label) *Encoder {
	ext := slices.Clone(external)
	slices.SortFunc(ext, func(a, b Label) int { return strings.Compare(a.Name, b.Name) })
	return &Encoder{external: ext, syms: make(map[string]uint32, 4096)}
}

// mergeIter walks a series' labels merged with the external labels, in
// name order.
type mergeIter struct {
	a, b []Label
	i, j int
}

func (m *mergeIter) next() (Label, bool) {
	if m.i < len(m.a) && (m.j >= len(m.b) || m.a[m.i].Name <= m.b[m.j].Name) {
		l := m.a[m.i]
		m.i++
		if m.j < len(m.b) && m.b[m.j].Name == l.Name {
			m.j++
		}
		return l, true
	}
	if m.j < len(m.b) {
		l := m.b[m.j]
		m.j++
		return l, true
	}
	return Label{}, false
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

func appendString(b []byte, tag byte, s string) []byte {
	b = append(b, tag)
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func sampleSize(t int64) int { return 1 + 8 + 1 + uvarintLen(uint64(t)) }

func appendSample(b []byte, v float64, t int64) []byte {
	b = append(b, 0x09)
	b = binary.LittleEndian.AppendUint64(b, math.Float64bits(v))
	b = append(b, 0x10)
	return binary.AppendUvarint(b, uint64(t))
}

func (e *Encoder) compress() []byte {
	n := snappy.MaxEncodedLen(len(e.pb))
	if cap(e.out) < n {
		e.out = make([]byte, n)
	}
	return snappy.Encode(e.out[:n], e.pb)
}

// EncodeV1 encodes a prometheus.WriteRequest (remote write 1.0), one
// TimeSeries with one sample per series, and snappy-compresses it.
func (e *Encoder) EncodeV1(series []Series) []byte {
	e.pb = e.appendV1(e.pb[:0], series)
	return e.compress()
}

func (e *Encoder) appendV1(pb []byte, series []Series) []byte {
	for i := range series {
		s := &series[i]
		lsz := 0
		it := mergeIter{a: s.Labels, b: e.external}
		for l, ok := it.next(); ok; l, ok = it.next() {
			m := labelSize(l)
			lsz += 1 + uvarintLen(uint64(m)) + m
		}
		smp := sampleSize(s.T)
		pb = append(pb, 0x0a)
		pb = binary.AppendUvarint(pb, uint64(lsz+1+uvarintLen(uint64(smp))+smp))
		it = mergeIter{a: s.Labels, b: e.external}
		for l, ok := it.next(); ok; l, ok = it.next() {
			pb = append(pb, 0x0a)
			pb = binary.AppendUvarint(pb, uint64(labelSize(l)))
			pb = appendString(pb, 0x0a, l.Name)
			pb = appendString(pb, 0x12, l.Value)
		}
		pb = append(pb, 0x12)
		pb = binary.AppendUvarint(pb, uint64(smp))
		pb = appendSample(pb, s.V, s.T)
	}
	return pb
}

func labelSize(l Label) int {
	return 1 + uvarintLen(uint64(len(l.Name))) + len(l.Name) + 1 + uvarintLen(uint64(len(l.Value))) + len(l.Value)
}

// EncodeV1Metadata encodes a 1.0 WriteRequest carrying only metadata, as
// Prometheus sends it periodically (metadata_config.send_interval).
func (e *Encoder) EncodeV1Metadata(descs []*MetricDesc) []byte {
	pb := e.pb[:0]
	for _, d := range descs {
		sz := 2 + (1 + uvarintLen(uint64(len(d.Name))) + len(d.Name)) + (1 + uvarintLen(uint64(len(d.Help))) + len(d.Help))
		pb = append(pb, 0x1a)
		pb = binary.AppendUvarint(pb, uint64(sz))
		pb = append(pb, 0x08, byte(d.Type)) // COUNTER=1 GAUGE=2 HISTOGRAM=3 in both enums
		pb = appendString(pb, 0x12, d.Name)
		pb = appendString(pb, 0x22, d.Help)
	}
	e.pb = pb
	return e.compress()
}

// EncodeV2 encodes an io.prometheus.write.v2.Request (remote write 2.0) with
// a symbol table and per-series metadata (type and help), and
// snappy-compresses it.
func (e *Encoder) EncodeV2(series []Series) []byte {
	e.pb = e.appendV2(e.pb[:0], series)
	return e.compress()
}

func (e *Encoder) symbol(s string) uint32 {
	if r, ok := e.syms[s]; ok {
		return r
	}
	r := uint32(len(e.symList))
	e.symList = append(e.symList, s)
	e.syms[s] = r
	return r
}

func (e *Encoder) appendV2(pb []byte, series []Series) []byte {
	clear(e.syms)
	e.symList = append(e.symList[:0], "") // the spec requires "" at index 0
	e.syms[""] = 0
	e.helpSet = [numFamilies]bool{}
	refs, ends := e.refs[:0], e.ends[:0]
	for i := range series {
		s := &series[i]
		it := mergeIter{a: s.Labels, b: e.external}
		for l, ok := it.next(); ok; l, ok = it.next() {
			refs = append(refs, e.symbol(l.Name), e.symbol(l.Value))
		}
		ends = append(ends, int32(len(refs)))
		if f := s.Desc.ID; !e.helpSet[f] {
			e.helpRef[f] = e.symbol(s.Desc.Help)
			e.helpSet[f] = true
		}
	}
	e.refs, e.ends = refs, ends
	for _, sy := range e.symList {
		pb = appendString(pb, 0x22, sy)
	}
	start := int32(0)
	for i := range series {
		s := &series[i]
		r := refs[start:ends[i]]
		start = ends[i]
		psz := 0
		for _, x := range r {
			psz += uvarintLen(uint64(x))
		}
		smp := sampleSize(s.T)
		typ := uint64(s.Desc.Type) // COUNTER=1 GAUGE=2 HISTOGRAM=3
		help := uint64(e.helpRef[s.Desc.ID])
		md := 1 + uvarintLen(typ)
		if help != 0 {
			md += 1 + uvarintLen(help)
		}
		tsz := 1 + uvarintLen(uint64(psz)) + psz + 1 + uvarintLen(uint64(smp)) + smp + 1 + uvarintLen(uint64(md)) + md
		pb = append(pb, 0x2a)
		pb = binary.AppendUvarint(pb, uint64(tsz))
		pb = append(pb, 0x0a)
		pb = binary.AppendUvarint(pb, uint64(psz))
		for _, x := range r {
			pb = binary.AppendUvarint(pb, uint64(x))
		}
		pb = append(pb, 0x12)
		pb = binary.AppendUvarint(pb, uint64(smp))
		pb = appendSample(pb, s.V, s.T)
		pb = append(pb, 0x2a)
		pb = binary.AppendUvarint(pb, uint64(md))
		pb = append(pb, 0x08)
		pb = binary.AppendUvarint(pb, typ)
		if help != 0 {
			pb = append(pb, 0x18)
			pb = binary.AppendUvarint(pb, help)
		}
	}
	return pb
}
