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
}

func newV1Decoder() *v1Decoder { return &v1Decoder{} }

func (d *v1Decoder) reset(body []byte) {
	d.body = body
	d.metadata = d.metadata[:0]
	d.e = nil
	d.cur.reset()
}

func (d *v1Decoder) series() *decodedSeries { return &d.cur }
func (d *v1Decoder) err() error             { return d.e }

func (d *v1Decoder) next() bool {
	for len(d.body) > 0 && d.e == nil {
		num, typ, n := protowire.ConsumeTag(d.body)
		if n < 0 {
			d.e = malformed("WriteRequest: bad tag")
			return false
		}
		d.body = d.body[n:]
		if (num == 1 || num == 3) && typ == protowire.BytesType {
			msg, m := protowire.ConsumeBytes(d.body)
			if m < 0 {
				d.e = malformed("WriteRequest: truncated field %d", num)
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
			return true
		}
		m := protowire.ConsumeFieldValue(num, typ, d.body)
		if m < 0 {
			d.e = malformed("WriteRequest: bad field %d", num)
			return false
		}
		d.body = d.body[m:]
	}
	return false
}

func (d *v1Decoder) parseSeries(b []byte) error {
	s := &d.cur
	s.reset()
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return malformed("TimeSeries: bad tag")
		}
		b = b[n:]
		if typ != protowire.BytesType || num < 1 || num > 4 {
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return malformed("TimeSeries: bad field %d", num)
			}
			b = b[m:]
			continue
		}
		msg, m := protowire.ConsumeBytes(b)
		if m < 0 {
			return malformed("TimeSeries: truncated field %d", num)
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
			smp, err := parseSample(msg)
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
			return nil, nil, malformed("Label: bad tag")
		}
		b = b[n:]
		if (num == 1 || num == 2) && typ == protowire.BytesType {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return nil, nil, malformed("Label: truncated field %d", num)
			}
			b = b[m:]
			if num == 1 {
				name = v
			} else {
				value = v
			}
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return nil, nil, malformed("Label: bad field %d", num)
		}
		b = b[m:]
	}
	return name, value, nil
}

// parseSample decodes a Sample of either version: 1 value (double),
// 2 timestamp (int64), and in 2.0 also 3 start_timestamp (int64).
func parseSample(b []byte) (sample, error) {
	var s sample
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return s, malformed("Sample: bad tag")
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.Fixed64Type:
			v, m := protowire.ConsumeFixed64(b)
			if m < 0 {
				return s, malformed("Sample: truncated value")
			}
			s.v = math.Float64frombits(v)
			b = b[m:]
		case (num == 2 || num == 3) && typ == protowire.VarintType:
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return s, malformed("Sample: truncated timestamp")
			}
			if num == 2 {
				s.t = int64(v)
			} else {
				s.st = int64(v)
			}
			b = b[m:]
		default:
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return s, malformed("Sample: bad field %d", num)
			}
			b = b[m:]
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
			d.e = malformed("Request: bad tag")
			return
		}
		b = b[n:]
		if num == 4 && typ == protowire.BytesType {
			sym, m := protowire.ConsumeBytes(b)
			if m < 0 {
				d.e = malformed("Request: truncated symbol")
				return
			}
			d.symbols = append(d.symbols, sym)
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			d.e = malformed("Request: bad field %d", num)
			return
		}
		b = b[m:]
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

func (d *v2Decoder) next() bool {
	for len(d.body) > 0 && d.e == nil {
		num, typ, n := protowire.ConsumeTag(d.body)
		if n < 0 {
			d.e = malformed("Request: bad tag")
			return false
		}
		d.body = d.body[n:]
		if num == 5 && typ == protowire.BytesType {
			msg, m := protowire.ConsumeBytes(d.body)
			if m < 0 {
				d.e = malformed("Request: truncated timeseries")
				return false
			}
			d.body = d.body[m:]
			if err := d.parseSeries(msg); err != nil {
				d.e = err
				return false
			}
			return true
		}
		m := protowire.ConsumeFieldValue(num, typ, d.body)
		if m < 0 {
			d.e = malformed("Request: bad field %d", num)
			return false
		}
		d.body = d.body[m:]
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
			return malformed("TimeSeries: bad tag")
		}
		b = b[n:]
		switch {
		case num == 1 && typ == protowire.BytesType: // packed labels_refs
			packed, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return malformed("TimeSeries: truncated labels_refs")
			}
			b = b[m:]
			for len(packed) > 0 {
				v, k := protowire.ConsumeVarint(packed)
				if k < 0 {
					return malformed("TimeSeries: bad labels_refs")
				}
				d.refs = append(d.refs, uint32(v))
				packed = packed[k:]
			}
		case num == 1 && typ == protowire.VarintType: // unpacked labels_refs
			v, m := protowire.ConsumeVarint(b)
			if m < 0 {
				return malformed("TimeSeries: bad labels_refs")
			}
			d.refs = append(d.refs, uint32(v))
			b = b[m:]
		case num >= 2 && num <= 5 && typ == protowire.BytesType:
			msg, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return malformed("TimeSeries: truncated field %d", num)
			}
			b = b[m:]
			switch num {
			case 2:
				smp, err := parseSample(msg)
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
			m := protowire.ConsumeFieldValue(num, typ, b)
			if m < 0 {
				return malformed("TimeSeries: bad field %d", num)
			}
			b = b[m:]
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
	return nil
}

func (d *v2Decoder) parseMetadata(b []byte) error {
	m := &d.cur.meta
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return malformed("Metadata: bad tag")
		}
		b = b[n:]
		if typ == protowire.VarintType && (num == 1 || num == 3 || num == 4) {
			v, k := protowire.ConsumeVarint(b)
			if k < 0 {
				return malformed("Metadata: truncated field %d", num)
			}
			b = b[k:]
			switch num {
			case 1:
				m.typ = int32(v)
			case 3, 4:
				sym, err := d.symbol(uint32(v))
				if err != nil {
					return err
				}
				if num == 3 {
					m.help = sym
				} else {
					m.unit = sym
				}
			}
			m.set = true
			continue
		}
		k := protowire.ConsumeFieldValue(num, typ, b)
		if k < 0 {
			return malformed("Metadata: bad field %d", num)
		}
		b = b[k:]
	}
	return nil
}
