package ingest

import (
	"errors"
	"fmt"
	"hash/maphash"
	"math"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"google.golang.org/protobuf/encoding/protowire"
)

// The decoders walk the protobuf wire format of a remote-write body directly
// instead of unmarshalling it into generated structs: a request of 2,000
// samples would otherwise allocate two strings per label per series, although
// almost every series is already known. A decoded series is a view into the
// request body (label names and values are sub-slices) plus two hashes of its
// label set, which the series cache turns into a TSDB series reference without
// ever building a labels.Labels for a known series.

// errMalformed marks a body that is not the protobuf message it claims to be.
var errMalformed = errors.New("malformed protobuf")

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errMalformed, fmt.Sprintf(format, args...))
}

// The decoders accept exactly what the generated protobuf code (gogo, as
// Prometheus' own receiver uses it) accepts, with the same content, except
// for input no protobuf encoder produces, where they are stricter (the fuzz
// targets check both, see fuzz_test.go):
//   - varints whose tenth byte carries bits beyond 64 (gogo drops the bits);
//   - field numbers above 2^31-1 (gogo truncates them to 32 bits);
//   - groups whose end marker names another field (gogo does not check);
//   - a packed varint cut by its field's end (gogo reads on into the bytes
//     after the field);
//   - 2.0: label, help and unit references outside the symbols table and an
//     odd number of label references (gogo leaves them to the caller);
//   - a body of the other version: a 2.0 body with any of the fields 1 to 3
//     (1.0's, which 2.0 reserves so that a 1.0 message is never read as
//     2.0), a 1.0 body with 2.0's symbols or timeseries and no 1.0 series
//     (gogo skips them as unknown fields: an empty request).
// A known field with the wrong wire type is rejected, as gogo does.

// badTag and badField describe a protowire parse failure n (< 0).
func badTag(msg string, n int) error {
	return malformed("%s: bad tag: %v", msg, protowire.ParseError(n))
}

func badField(msg string, num protowire.Number, n int) error {
	return malformed("%s: bad field %d: %v", msg, num, protowire.ParseError(n))
}

func wrongType(msg string, num protowire.Number, typ protowire.Type) error {
	return malformed("%s: field %d has wire type %d", msg, num, typ)
}

// skipField skips a field this decoder does not read.
func skipField(msg string, num protowire.Number, typ protowire.Type, b []byte) ([]byte, error) {
	m := protowire.ConsumeFieldValue(num, typ, b)
	if m < 0 {
		return nil, badField(msg, num, m)
	}
	return b[m:], nil
}

type labelPair struct{ name, value []byte }

type sample struct {
	t, st int64
	v     float64
}

// seriesMeta is a series' metadata as it came on the wire; help and unit point into the body.
type seriesMeta struct {
	typ        int32 // prompb.MetricMetadata_MetricType / writev2.Metadata_MetricType, same numbering
	help, unit []byte
	set        bool
	// 2.0: the symbol references of help and unit, resolved once the whole
	// series is read (a field may come more than once; the last one counts).
	helpRef, unitRef uint32
}

// decodedSeries is one time series of a request. Its slices are valid until
// the decoder moves on.
type decodedSeries struct {
	labels     []labelPair
	samples    []sample
	histograms [][]byte // raw Histogram messages; rare, decoded with the generated code
	exemplars  [][]byte // raw Exemplar messages
	meta       seriesMeta
}

func (s *decodedSeries) reset() {
	s.labels = s.labels[:0]
	s.samples = s.samples[:0]
	s.histograms = s.histograms[:0]
	s.exemplars = s.exemplars[:0]
	s.meta = seriesMeta{}
}

// maxPooledViews is the most views into a body (labels, samples, metadata,
// symbols) a pooled decoder keeps room for.
const maxPooledViews = 1 << 12

// release lets go of the views into the request's body, so a pooled
// decoder does not keep the body alive, and of slices grown past
// maxPooledViews.
func (s *decodedSeries) release() {
	s.labels = releaseViews(s.labels)
	s.samples = releaseViews(s.samples)
	s.histograms = releaseViews(s.histograms)
	s.exemplars = releaseViews(s.exemplars)
	s.meta = seriesMeta{}
}

// releaseViews empties s, zeroing what its elements referenced, or drops it
// when it grew past maxPooledViews.
func releaseViews[T any](s []T) []T {
	if cap(s) > maxPooledViews {
		return nil
	}
	clear(s[:cap(s)])
	return s[:0]
}

// seriesDecoder yields the series of one request.
type seriesDecoder interface {
	next() bool
	series() *decodedSeries
	err() error
}

// hashSeed2 seeds the second hash; the cache lives in memory only, so a
// per-process seed is fine.
var hashSeed2 = maphash.MakeSeed()

// seriesKey identifies a series in the series cache by two independent
// 64-bit hashes, xxhash and Go's maphash (AES-based), of its label pairs
// separated by 0xff (which UTF-8 never contains). Two unrelated hashes make
// an accidental collision, which would file samples under the wrong series,
// as unlikely as a 128-bit hash: about 1e-27 for a million series. The pairs
// are copied into one buffer first so each hash runs once over a few hundred
// bytes instead of dozens of times over a few.
//
// When clusterLabel is set and the series carries both it and replicaLabel
// (a series of a Prometheus HA pair), the replica label is left out of the
// key: both replicas' copies of a series are one TSDB series and share one
// cache entry, where the dedup keeps its per-series state. cluster and
// replica are then returned (views into the body).
type seriesKey struct {
	buf              []byte
	h1, h2           uint64
	cluster, replica []byte
}

func (k *seriesKey) compute(pairs []labelPair, clusterLabel, replicaLabel string) {
	// One pass copies the pairs and notes where the replica pair landed; it
	// is cut out afterwards if the cluster label is there too.
	k.cluster, k.replica = nil, nil
	k.buf = k.buf[:0]
	repStart, repEnd := -1, -1
	for _, p := range pairs {
		if clusterLabel != "" {
			switch {
			case len(p.name) == len(clusterLabel) && yoloString(p.name) == clusterLabel:
				k.cluster = p.value
			case repStart < 0 && len(p.name) == len(replicaLabel) && yoloString(p.name) == replicaLabel:
				k.replica = p.value
				repStart = len(k.buf)
			}
		}
		k.buf = append(k.buf, p.name...)
		k.buf = append(k.buf, 0xff)
		k.buf = append(k.buf, p.value...)
		k.buf = append(k.buf, 0xff)
		if repStart >= 0 && repEnd < 0 {
			repEnd = len(k.buf)
		}
	}
	if len(k.cluster) == 0 || len(k.replica) == 0 {
		k.cluster, k.replica = nil, nil
	} else {
		k.buf = append(k.buf[:repStart], k.buf[repEnd:]...)
	}
	k.h1, k.h2 = xxhash.Sum64(k.buf), maphash.Bytes(hashSeed2, k.buf)
}

// yoloString views b as a string without copying. The result must not outlive
// the request body.
func yoloString(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// --- remote write 1.0: prometheus.WriteRequest ---------------------------------

type v1Decoder struct {
	body     []byte
	cur      decodedSeries
	metadata [][]byte // raw MetricMetadata messages, seen so far
	e        error
	// sawSeries: the body had a 1.0 series (field 1); sawV2: it had 2.0's
	// symbols or timeseries (fields 4, 5), which 1.0 does not define.
	sawSeries, sawV2 bool
	// startTimestamps: read a Sample's start_timestamp (field 3) as 2.0
	// numbers it. Only a receiver does, from its distributor, which sends
	// it on the samples that get a created-timestamp zero; anyone else's
	// 1.0 field 3 is an unknown field, skipped as gogo skips it.
	startTimestamps bool
}

// Each version's decoder skips the other's fields as unknown, so a body sent
// with the other version's Content-Type would decode as an empty request:
// answered 204 with nothing stored. These errors name the mismatch instead.
var (
	errV1AsV2 = malformed("remote write 1.0 body sent with the 2.0 Content-Type (proto=%s): it carries prometheus.WriteRequest's fields, which 2.0 reserves; send it as %s or encode %s", protoV2, protoV1, protoV2)
	errV2AsV1 = malformed("remote write 2.0 body sent with the 1.0 Content-Type: it carries %s's symbols and timeseries and no 1.0 series; send it with Content-Type application/x-protobuf;proto=%s", protoV2, protoV2)
)

func newV1Decoder() *v1Decoder { return &v1Decoder{} }

// release lets go of the request's body (see decodedSeries.release).
func (d *v1Decoder) release() {
	d.body, d.e = nil, nil
	d.metadata = releaseViews(d.metadata)
	d.cur.release()
}

func (d *v1Decoder) reset(body []byte) {
	d.body = body
	d.metadata = d.metadata[:0]
	d.e = nil
	d.sawSeries, d.sawV2 = false, false
	d.cur.reset()
}

func (d *v1Decoder) series() *decodedSeries { return &d.cur }
func (d *v1Decoder) err() error             { return d.e }

func (d *v1Decoder) next() bool {
	for len(d.body) > 0 && d.e == nil {
		num, typ, n := protowire.ConsumeTag(d.body)
		if n < 0 {
			d.e = badTag("WriteRequest", n)
			return false
		}
		d.body = d.body[n:]
		if num != 1 && num != 3 {
			d.sawV2 = d.sawV2 || ((num == 4 || num == 5) && typ == protowire.BytesType)
			d.body, d.e = skipField("WriteRequest", num, typ, d.body)
			continue
		}
		if typ != protowire.BytesType {
			d.e = wrongType("WriteRequest", num, typ)
			return false
		}
		msg, m := protowire.ConsumeBytes(d.body)
		if m < 0 {
			d.e = badField("WriteRequest", num, m)
			return false
		}
		d.body = d.body[m:]
		if num == 3 {
			d.metadata = append(d.metadata, msg)
			continue
		}
		if err := d.parseSeries(msg); err != nil {
			d.e = err
			return false
		}
		d.sawSeries = true
		return true
	}
	if d.e == nil && d.sawV2 && !d.sawSeries {
		d.e = errV2AsV1
	}
	return false
}

func (d *v1Decoder) parseSeries(b []byte) error {
	s := &d.cur
	s.reset()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return badTag("TimeSeries", n)
		}
		b = b[n:]
		if num < 1 || num > 4 {
			var err error
			if b, err = skipField("TimeSeries", num, typ, b); err != nil {
				return err
			}
			continue
		}
		if typ != protowire.BytesType {
			return wrongType("TimeSeries", num, typ)
		}
		msg, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return badField("TimeSeries", num, m)
		}
		b = b[m:]
		switch num {
		case 1:
			name, value, err := parseV1Label(msg)
			if err != nil {
				return err
			}
			s.labels = append(s.labels, labelPair{name, value})
		case 2:
			smp, err := parseSample(msg, d.startTimestamps)
			if err != nil {
				return err
			}
			s.samples = append(s.samples, smp)
		case 3:
			s.exemplars = append(s.exemplars, msg)
		case 4:
			s.histograms = append(s.histograms, msg)
		}
	}
	return nil
}

func parseV1Label(b []byte) (name, value []byte, err error) {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, badTag("Label", n)
		}
		b = b[n:]
		if num != 1 && num != 2 {
			if b, err = skipField("Label", num, typ, b); err != nil {
				return nil, nil, err
			}
			continue
		}
		if typ != protowire.BytesType {
			return nil, nil, wrongType("Label", num, typ)
		}
		v, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return nil, nil, badField("Label", num, m)
		}
		b = b[m:]
		if num == 1 {
			name = v
		} else {
			value = v
		}
	}
	return name, value, nil
}

// parseSample decodes a Sample of either version: 1 value (double),
// 2 timestamp (int64), and with withStart (2.0, or 1.0 from a distributor)
// also 3 start_timestamp (int64).
func parseSample(b []byte, withStart bool) (sample, error) {
	var s sample
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return s, badTag("Sample", n)
		}
		b = b[n:]
		switch {
		case num == 1:
			if typ != protowire.Fixed64Type {
				return s, wrongType("Sample", num, typ)
			}
			v, m := protowire.ConsumeFixed64(b)
			if m < 0 {
				return s, badField("Sample", num, m)
			}
			s.v = math.Float64frombits(v)
			b = b[m:]
		case num == 2 || (withStart && num == 3):
			if typ != protowire.VarintType {
				return s, wrongType("Sample", num, typ)
			}
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return s, badField("Sample", num, m)
			}
			if num == 2 {
				s.t = int64(v)
			} else {
				s.st = int64(v)
			}
			b = b[m:]
		default:
			var err error
			if b, err = skipField("Sample", num, typ, b); err != nil {
				return s, err
			}
		}
	}
	return s, nil
}

// --- remote write 2.0: io.prometheus.write.v2.Request ----------------------------

type v2Decoder struct {
	body    []byte // what remains to be walked for timeseries
	symbols [][]byte
	cur     decodedSeries
	refs    []uint32
	e       error
}

func newV2Decoder() *v2Decoder { return &v2Decoder{} }

// release lets go of the request's body (see decodedSeries.release).
func (d *v2Decoder) release() {
	d.body, d.e = nil, nil
	d.symbols = releaseViews(d.symbols)
	d.refs = releaseViews(d.refs)
	d.cur.release()
}

// reset collects the symbol table first: the spec puts no order on fields, so
// a series may come before the symbols it refers to.
func (d *v2Decoder) reset(body []byte) {
	d.body = body
	d.symbols = d.symbols[:0]
	d.e = nil
	d.cur.reset()
	b := body
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			d.e = badTag("Request", n)
			return
		}
		b = b[n:]
		if num >= 1 && num <= 3 {
			d.e = errV1AsV2
			return
		}
		if (num == 4 || num == 5) && typ != protowire.BytesType {
			d.e = wrongType("Request", num, typ)
			return
		}
		if num == 4 {
			sym, m := protowire.ConsumeBytes(b)
			if m < 0 {
				d.e = badField("Request", num, m)
				return
			}
			d.symbols = append(d.symbols, sym)
			b = b[m:]
			continue
		}
		if b, d.e = skipField("Request", num, typ, b); d.e != nil {
			return
		}
	}
}

func (d *v2Decoder) series() *decodedSeries { return &d.cur }
func (d *v2Decoder) err() error             { return d.e }

func (d *v2Decoder) symbol(ref uint32) ([]byte, error) {
	if int(ref) >= len(d.symbols) {
		return nil, fmt.Errorf("%w: symbol reference %d out of range (table has %d)", errMalformed, ref, len(d.symbols))
	}
	return d.symbols[ref], nil
}

// next walks the body a second time, for the series; reset has checked its
// framing already.
func (d *v2Decoder) next() bool {
	for len(d.body) > 0 && d.e == nil {
		num, typ, n := protowire.ConsumeTag(d.body)
		if n < 0 {
			d.e = badTag("Request", n)
			return false
		}
		d.body = d.body[n:]
		if num != 5 {
			d.body, d.e = skipField("Request", num, typ, d.body)
			continue
		}
		msg, m := protowire.ConsumeBytes(d.body)
		if m < 0 {
			d.e = badField("Request", num, m)
			return false
		}
		d.body = d.body[m:]
		if err := d.parseSeries(msg); err != nil {
			d.e = err
			return false
		}
		return true
	}
	return false
}

func (d *v2Decoder) parseSeries(b []byte) error {
	s := &d.cur
	s.reset()
	d.refs = d.refs[:0]
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return badTag("TimeSeries", n)
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType: // packed labels_refs
			packed, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return badField("TimeSeries", num, m)
			}
			b = b[m:]
			for len(packed) > 0 {
				v, k := protowire.ConsumeVarint(packed)
				if k < 0 {
					return malformed("TimeSeries: bad field %d: a packed varint runs past the field's end: %v", num, protowire.ParseError(k))
				}
				d.refs = append(d.refs, uint32(v))
				packed = packed[k:]
			}
		case num == 1 && typ == protowire.VarintType: // unpacked labels_refs
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return badField("TimeSeries", num, m)
			}
			d.refs = append(d.refs, uint32(v))
			b = b[m:]
		case num >= 1 && num <= 5 && typ != protowire.BytesType:
			return wrongType("TimeSeries", num, typ)
		case num >= 2 && num <= 5:
			msg, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return badField("TimeSeries", num, m)
			}
			b = b[m:]
			switch num {
			case 2:
				smp, err := parseSample(msg, true)
				if err != nil {
					return err
				}
				s.samples = append(s.samples, smp)
			case 3:
				s.histograms = append(s.histograms, msg)
			case 4:
				s.exemplars = append(s.exemplars, msg)
			case 5:
				if err := d.parseMetadata(msg); err != nil {
					return err
				}
			}
		default:
			var err error
			if b, err = skipField("TimeSeries", num, typ, b); err != nil {
				return err
			}
		}
	}
	if len(d.refs)%2 != 0 {
		return malformed("TimeSeries: odd number of labels_refs (%d)", len(d.refs))
	}
	for i := 0; i < len(d.refs); i += 2 {
		name, err := d.symbol(d.refs[i])
		if err != nil {
			return err
		}
		value, err := d.symbol(d.refs[i+1])
		if err != nil {
			return err
		}
		s.labels = append(s.labels, labelPair{name, value})
	}
	if m := &s.meta; m.set {
		var err error
		if m.help, err = d.metaSymbol(m.helpRef); err != nil {
			return err
		}
		if m.unit, err = d.metaSymbol(m.unitRef); err != nil {
			return err
		}
	}
	return nil
}

// metaSymbol resolves a help or unit reference. 0, the default of a field
// not sent, is the empty string even in a request without symbols.
func (d *v2Decoder) metaSymbol(ref uint32) ([]byte, error) {
	if ref == 0 && len(d.symbols) == 0 {
		return nil, nil
	}
	return d.symbol(ref)
}

func (d *v2Decoder) parseMetadata(b []byte) error {
	m := &d.cur.meta
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return badTag("Metadata", n)
		}
		b = b[n:]
		if num == 1 || num == 3 || num == 4 {
			if typ != protowire.VarintType {
				return wrongType("Metadata", num, typ)
			}
			v, k := protowire.ConsumeVarint(b)
			if k < 0 {
				return badField("Metadata", num, k)
			}
			b = b[k:]
			switch num {
			case 1:
				m.typ = int32(v)
			case 3:
				m.helpRef = uint32(v)
			case 4:
				m.unitRef = uint32(v)
			}
			m.set = true
			continue
		}
		var err error
		if b, err = skipField("Metadata", num, typ, b); err != nil {
			return err
		}
	}
	return nil
}
