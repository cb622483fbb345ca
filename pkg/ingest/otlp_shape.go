package ingest

import (
	"fmt"
	"net/http"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/gpustore/gpustore/pkg/limits"
)

// An OTLP export request is judged by its shape before pdata decodes it.
// Unlike a remote-write body, which gpustore decodes into views of its own
// bytes (decode.go), pdata builds a Go object for every message of the
// request, and the translator walks nested attribute values recursively.
// Two shapes are therefore dangerous in a body that passes the size limits:
//   - nesting: attribute values (AnyValue arrays and key-value lists) nested
//     two million deep are a 127 KB gzip JSON body, and the translator's
//     recursive encoding of the value overflows the goroutine stack, a fatal
//     error that takes the whole process down;
//   - expansion: a message costs pdata ~70 to ~200 bytes of objects however
//     few bytes it takes on the wire (an empty data point is two bytes), so a
//     body of empty messages grows 70-fold when decoded; a DCGM export grows
//     ~5-fold (protobuf) and ~3-fold (JSON).
//   - attributes: Prometheus' translator builds a series' labels in time
//     quadratic in their number (one data point of 40,000 attributes took
//     6.7 s), and copies a point's labels into each series it makes of it (a
//     histogram point of 20,000 bounds and 2,000 attributes took 2 GB).
// The scan (scanOTLP) refuses nesting deeper than any exporter sends and more
// attributes than a series may have labels, and estimates from the wire what
// pdata will allocate and the series and labels the translation will build,
// so the in-flight bound (ingest.max_inflight_bytes) holds what a request
// will make, not only its bytes.

// maxOTLPDepth bounds the nesting of an export request's messages. A data
// point's attribute sits 8 messages deep (request, resource metrics, scope
// metrics, metric, gauge, data point, key-value, value); each level of a
// nested attribute value adds two (an array or list, then its value).
// OpenTelemetry sets no limit; 64 leaves 28 levels of nested values.
const maxOTLPDepth = 64

// The kinds of message an export request holds (opentelemetry-proto's
// metrics/v1, common/v1 and resource/v1, as pdata v1.69 decodes them).
type otlpKind uint8

const (
	otlpLeaf otlpKind = iota // a scalar, a string or bytes: costs its bytes
	otlpRequest
	otlpResourceMetrics
	otlpResource
	otlpScopeMetrics
	otlpScope
	otlpMetric
	otlpNumberPoints // Gauge and Sum
	otlpHistogram
	otlpExpHistogram
	otlpSummary
	otlpNumberPoint
	otlpHistogramPoint
	otlpExpHistogramPoint
	otlpBuckets
	otlpSummaryPoint
	otlpQuantile
	otlpExemplar
	otlpKeyValue
	otlpAnyValue
	otlpArray
	otlpKeyValueList
	otlpEntityRef
	otlpNumbers   // a repeated number or string field (packed or not)
	otlpBoundList // a histogram point's explicit bounds: otlpNumbers, counted
	otlpUnknown   // a JSON object or array under a name pdata does not know
	otlpKinds
)

// otlpFields maps, per kind, the fields that are messages (or repeated
// numbers) to their kind; every other field is a leaf. All are numbered
// below 13 but resource metrics' deprecated scope metrics (1000, see
// fieldKind).
var otlpFields = [otlpKinds][13]otlpKind{
	otlpRequest:           {1: otlpResourceMetrics},
	otlpResourceMetrics:   {1: otlpResource, 2: otlpScopeMetrics},
	otlpResource:          {1: otlpKeyValue, 3: otlpEntityRef},
	otlpScopeMetrics:      {1: otlpScope, 2: otlpMetric},
	otlpScope:             {3: otlpKeyValue},
	otlpMetric:            {5: otlpNumberPoints, 7: otlpNumberPoints, 9: otlpHistogram, 10: otlpExpHistogram, 11: otlpSummary, 12: otlpKeyValue},
	otlpNumberPoints:      {1: otlpNumberPoint},
	otlpHistogram:         {1: otlpHistogramPoint},
	otlpExpHistogram:      {1: otlpExpHistogramPoint},
	otlpSummary:           {1: otlpSummaryPoint},
	otlpNumberPoint:       {7: otlpKeyValue, 5: otlpExemplar},
	otlpHistogramPoint:    {9: otlpKeyValue, 6: otlpNumbers, 7: otlpBoundList, 8: otlpExemplar},
	otlpExpHistogramPoint: {1: otlpKeyValue, 8: otlpBuckets, 9: otlpBuckets, 11: otlpExemplar},
	otlpBuckets:           {2: otlpNumbers},
	otlpSummaryPoint:      {7: otlpKeyValue, 6: otlpQuantile},
	otlpExemplar:          {7: otlpKeyValue},
	otlpKeyValue:          {2: otlpAnyValue},
	otlpAnyValue:          {5: otlpArray, 6: otlpKeyValueList},
	otlpArray:             {1: otlpAnyValue},
	otlpKeyValueList:      {1: otlpKeyValue},
	otlpEntityRef:         {3: otlpNumbers, 4: otlpNumbers},
}

// otlpMessageBytes is what pdata allocates for one message of each kind,
// with the growth of the slice that holds it (measured as bytes allocated
// per message for bodies of many empty messages of one kind, pdata v1.69,
// with a margin: TestOTLPShapeCoversDecoding keeps it honest against pdata
// upgrades).
var otlpMessageBytes = [otlpKinds]int64{
	otlpRequest:           64,
	otlpResourceMetrics:   224, // measured 166
	otlpResource:          0,   // inside its resource metrics
	otlpScopeMetrics:      224, // 150
	otlpScope:             0,   // inside its scope metrics
	otlpMetric:            192, // 134
	otlpNumberPoints:      48,  // 32
	otlpHistogram:         48,
	otlpExpHistogram:      48,
	otlpSummary:           48,
	otlpNumberPoint:       192, // 134
	otlpHistogramPoint:    256, // 198
	otlpExpHistogramPoint: 320, // 246
	otlpBuckets:           0,   // inside its data point
	otlpSummaryPoint:      192, // 134
	otlpQuantile:          96,  // 54
	otlpExemplar:          448, // 376
	otlpKeyValue:          256, // 205
	otlpAnyValue:          96,  // 78 (in an array), the oneof's wrapper
	otlpArray:             64,
	otlpKeyValueList:      64,
	otlpEntityRef:         192, // 118
	otlpUnknown:           448, // as dear as the dearest message
}

// otlpNumberBytes is what a repeated number or string field costs per
// byte on the wire: a packed varint is one byte per 8-byte element, a
// string two bytes per 16-byte header, and slices grow by doubling
// (measured 33 for packed bucket counts, 39 for strings).
const otlpNumberBytes = 48

// otlpBounds are what an export request's shape may not pass, and what its
// translation adds to each series, from the tenant's limits.
type otlpBounds struct {
	// maxAttributes bounds the attributes of a data point, and of a scope
	// and a resource whose attributes become labels (0: no bound).
	maxAttributes int
	// scopeLabels: a scope's name, version, schema URL and attributes
	// label each of its series (promote_scope_metadata).
	scopeLabels bool
	// targetInfo: each resource gets a target_info series labelled with its
	// attributes.
	targetInfo bool
	// promoted is how many of a resource's attributes label each of its
	// series: -1 all (promote_all_resource_attributes), else the length of
	// promote_resource_attributes.
	promoted int
	// nhcb: a classic histogram point is one series of a native histogram
	// with custom buckets, not a series per bucket.
	nhcb bool
}

// otlpAttributeSlack is how many attributes beyond max_label_names_per_series
// a data point, scope or resource may have: those the translation leaves out
// (a resource's service.name, service.namespace and service.instance.id,
// which make job and instance; a point's __name__) or merges (names that
// collide once escaped), with room to spare.
const otlpAttributeSlack = 8

// otlpAddedLabels is what the translation adds to a data point's attributes
// in each of its series at most: __name__, job, instance, le or quantile.
const otlpAddedLabels = 4

func otlpBoundsOf(l limits.Limits) otlpBounds {
	o := l.OTLP
	b := otlpBounds{
		maxAttributes: l.MaxLabelNamesPerSeries + otlpAttributeSlack,
		scopeLabels:   o.PromoteScopeMetadata,
		targetInfo:    !o.DisableTargetInfo,
		promoted:      len(o.PromoteResourceAttributes),
		nhcb:          o.ConvertHistogramsToNHCB,
	}
	if o.PromoteAllResourceAttributes {
		b.promoted = -1
	}
	return b
}

// otlpShape is what scanOTLP learns of an export request.
type otlpShape struct {
	// objects is what pdata allocates decoding it, in bytes.
	objects int64
	// series is how many series the translation makes of its points (one
	// per number point, bucket and quantile, the count, sum and +Inf of
	// each histogram, a target_info per resource), labels their labels
	// summed (and the exemplars'), values the exponential histograms'
	// bucket counts. A resource's target_info repeated over a long span of
	// timestamps is not in it: the translation counts what it appends
	// (rw2Appender).
	series, labels, values int64
}

// What the translation allocates: measured with histogramExport (pdata
// v1.69, Prometheus v0.316) as ~1.2 KiB per series and ~30 bytes per label
// of a series (the translator's labels, their symbols and references, the
// 2.0 body), and ~160 KiB for any request (the translator's builders and
// caches); TestOTLPShapeCoversTranslation keeps it honest.
const (
	otlpSeriesBytes      = 2048
	otlpLabelBytes       = 64
	otlpValueBytes       = 16
	otlpTranslationBytes = 256 << 10
)

// translationBytes is what translating the request will allocate.
func (s otlpShape) translationBytes() int64 {
	return otlpTranslationBytes + s.series*otlpSeriesBytes + s.labels*otlpLabelBytes + s.values*otlpValueBytes
}

// scanOTLP judges an export request's body from the wire: a 400 for a body
// nested deeper than maxOTLPDepth, with more attributes somewhere than b
// allows, or not well formed; else its shape.
func scanOTLP(body []byte, asJSON bool, b otlpBounds) (otlpShape, error) {
	sc := otlpScanner{bounds: b}
	f := &sc.frames[1]
	*f = otlpFrame{kind: otlpRequest}
	var err error
	if asJSON {
		err = sc.json(body, f)
	} else {
		err = sc.proto(body, 1)
	}
	if err != nil {
		return otlpShape{}, &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf("decode OTLP metrics export request: %v", err)}
	}
	// Strings are copied out of the body.
	return otlpShape{objects: f.objects + int64(len(body)), series: f.series, labels: f.labels, values: f.values}, nil
}

type otlpScanner struct {
	bounds otlpBounds
	// frames are the protobuf messages being scanned, by depth.
	frames [maxOTLPDepth + 2]otlpFrame
}

// otlpFrame is what the scan has counted of one message so far.
type otlpFrame struct {
	kind    otlpKind
	objects int64
	// attrs counts its key-values (a point's, scope's or resource's
	// attributes), quantiles a summary point's quantiles, bounds a
	// histogram point's explicit bounds.
	attrs, quantiles, bounds int
	// scopeAttrs and resourceAttrs are the attributes of a scope metrics'
	// scope and of a resource metrics' resource.
	scopeAttrs, resourceAttrs int
	// Of the points inside it: see otlpShape.
	series, labels, values int64
}

// adopt adds a message that ended inside f.
func (f *otlpFrame) adopt(c *otlpFrame) {
	f.objects += c.objects
	f.series += c.series
	f.labels += c.labels
	f.values += c.values
	switch c.kind {
	case otlpKeyValue:
		f.attrs++
	case otlpQuantile:
		f.quantiles++
	case otlpScope:
		f.scopeAttrs = c.attrs
	case otlpResource:
		f.resourceAttrs = c.attrs
	}
}

// finish judges a message once it has ended and counts its series.
func (sc *otlpScanner) finish(f *otlpFrame) error {
	b := sc.bounds
	over := b.maxAttributes > 0 && f.attrs > b.maxAttributes
	var series int64
	switch f.kind {
	case otlpNumberPoint, otlpExpHistogramPoint:
		series = 1
	case otlpHistogramPoint:
		series = int64(f.bounds) + 3 // and count, sum, +Inf
		if b.nhcb {
			series = 1
		}
	case otlpSummaryPoint:
		series = int64(f.quantiles) + 2 // and count, sum
	case otlpExemplar:
		f.labels += int64(f.attrs) + 2 // and trace and span IDs
	case otlpScope:
		if over && b.scopeLabels {
			return sc.tooManyAttributes("an instrumentation scope", f.attrs, "; its attributes label each of its series as the tenant has otlp.promote_scope_metadata")
		}
	case otlpResource:
		if over && (b.targetInfo || b.promoted < 0) {
			return sc.tooManyAttributes("a resource", f.attrs, "; its attributes label its target_info series (otlp.disable_target_info turns it off) or, with otlp.promote_all_resource_attributes, each of its series")
		}
	case otlpScopeMetrics:
		if b.scopeLabels {
			f.labels += f.series * int64(f.scopeAttrs+3) // and otel_scope_name, _version, _schema_url
		}
	case otlpResourceMetrics:
		promoted := b.promoted
		if promoted < 0 || promoted > f.resourceAttrs {
			promoted = f.resourceAttrs
		}
		f.labels += f.series * int64(promoted)
		if b.targetInfo && f.resourceAttrs > 0 {
			f.series++
			f.labels += int64(f.resourceAttrs) + 1 // and __name__
		}
	}
	if series > 0 {
		if over {
			return sc.tooManyAttributes("a data point", f.attrs, "")
		}
		f.series += series
		f.labels += series * int64(f.attrs+otlpAddedLabels)
	}
	return nil
}

func (sc *otlpScanner) tooManyAttributes(what string, n int, why string) error {
	return fmt.Errorf("%s has %d attributes, more than a series may have labels (the tenant's max_label_names_per_series, %d, and %d the translation may leave out or merge)%s: the export request is refused before decoding; send fewer attributes or raise the limit",
		what, n, sc.bounds.maxAttributes-otlpAttributeSlack, otlpAttributeSlack, why)
}

// proto scans a protobuf message at depth, whose frame is frames[depth].
func (sc *otlpScanner) proto(b []byte, depth int) error {
	if depth > maxOTLPDepth {
		return fmt.Errorf("messages nested deeper than %d levels", maxOTLPDepth)
	}
	f := &sc.frames[depth]
	f.objects += otlpMessageBytes[f.kind]
	for len(b) > 0 {
		num, typ, tag := protowire.ConsumeTag(b)
		if tag < 0 {
			return protowire.ParseError(tag)
		}
		b = b[tag:]
		var v []byte
		var l int
		if typ == protowire.BytesType {
			v, l = protowire.ConsumeBytes(b)
		} else {
			l = protowire.ConsumeFieldValue(num, typ, b)
		}
		if l < 0 {
			return protowire.ParseError(l)
		}
		b = b[l:]
		switch child := fieldKind(f.kind, num); {
		case child == otlpNumbers || child == otlpBoundList:
			f.objects += int64(tag+l) * otlpNumberBytes
			switch {
			case child == otlpBoundList && typ == protowire.BytesType:
				f.bounds += len(v) / 8 // packed doubles
			case child == otlpBoundList:
				f.bounds++
			case f.kind == otlpBuckets:
				f.values += int64(l) // a packed varint takes a byte at least
			}
		case child != otlpLeaf && typ == protowire.BytesType:
			sc.frames[depth+1] = otlpFrame{kind: child}
			if err := sc.proto(v, depth+1); err != nil {
				return err
			}
			f.adopt(&sc.frames[depth+1])
		}
	}
	return sc.finish(f)
}

func fieldKind(k otlpKind, num protowire.Number) otlpKind {
	switch {
	case num < protowire.Number(len(otlpFields[k])):
		return otlpFields[k][num]
	case k == otlpResourceMetrics && num == 1000:
		return otlpScopeMetrics
	}
	return otlpLeaf
}

// otlpJSONFields maps, per kind, the JSON members that hold messages (or
// arrays of numbers) to their kind, named as pdata reads them
// (lowerCamelCase or snake_case: compared without '_' and case). An object
// or array under any other name is otlpUnknown, priced as the dearest
// message.
var otlpJSONFields = map[otlpKind]map[string]otlpKind{
	otlpRequest:           {"resourcemetrics": otlpResourceMetrics},
	otlpResourceMetrics:   {"resource": otlpResource, "scopemetrics": otlpScopeMetrics, "instrumentationlibrarymetrics": otlpScopeMetrics},
	otlpResource:          {"attributes": otlpKeyValue, "entityrefs": otlpEntityRef},
	otlpScopeMetrics:      {"scope": otlpScope, "instrumentationlibrary": otlpScope, "metrics": otlpMetric},
	otlpScope:             {"attributes": otlpKeyValue},
	otlpMetric:            {"gauge": otlpNumberPoints, "sum": otlpNumberPoints, "histogram": otlpHistogram, "exponentialhistogram": otlpExpHistogram, "summary": otlpSummary, "metadata": otlpKeyValue},
	otlpNumberPoints:      {"datapoints": otlpNumberPoint},
	otlpHistogram:         {"datapoints": otlpHistogramPoint},
	otlpExpHistogram:      {"datapoints": otlpExpHistogramPoint},
	otlpSummary:           {"datapoints": otlpSummaryPoint},
	otlpNumberPoint:       {"attributes": otlpKeyValue, "exemplars": otlpExemplar},
	otlpHistogramPoint:    {"attributes": otlpKeyValue, "exemplars": otlpExemplar, "bucketcounts": otlpNumbers, "explicitbounds": otlpBoundList},
	otlpExpHistogramPoint: {"attributes": otlpKeyValue, "exemplars": otlpExemplar, "positive": otlpBuckets, "negative": otlpBuckets},
	otlpBuckets:           {"bucketcounts": otlpNumbers},
	otlpSummaryPoint:      {"attributes": otlpKeyValue, "quantilevalues": otlpQuantile},
	otlpExemplar:          {"filteredattributes": otlpKeyValue},
	otlpKeyValue:          {"value": otlpAnyValue},
	otlpAnyValue:          {"arrayvalue": otlpArray, "kvlistvalue": otlpKeyValueList},
	otlpArray:             {"values": otlpAnyValue},
	otlpKeyValueList:      {"values": otlpKeyValue},
	otlpEntityRef:         {"idkeys": otlpNumbers, "descriptionkeys": otlpNumbers},
}

func jsonFieldKind(k otlpKind, name []byte) otlpKind {
	fields := otlpJSONFields[k]
	if fields == nil {
		return otlpUnknown
	}
	var buf [32]byte // longer than any name in the table
	key := buf[:0]
	for _, c := range name {
		switch {
		case c == '_':
			continue
		case len(key) == len(buf):
			return otlpUnknown
		case 'A' <= c && c <= 'Z':
			c += 'a' - 'A'
		}
		key = append(key, c)
	}
	if c, ok := fields[string(key)]; ok {
		return c
	}
	return otlpUnknown
}

// otlpJSONElementBytes is what an array element that is not an object (a
// bucket count, a bound, an entity key) costs: one element of at least two
// bytes (",0") as a string header or a number, with the slice's doubling.
const otlpJSONElementBytes = 2 * otlpNumberBytes

// jsonContainer is an object or an array the JSON scan is inside.
type jsonContainer struct {
	array bool
	// An object's message; an array's kind of elements and their count.
	frame    otlpFrame
	elements int
}

// json scans a JSON body's structure (objects, arrays, member names)
// without decoding it, as proto does the wire format; f is the request.
func (sc *otlpScanner) json(b []byte, f *otlpFrame) error {
	// JSON nests two levels per message (an object, the array holding it).
	var stack [2*maxOTLPDepth + 1]jsonContainer
	depth := 0
	var member []byte // the name of the member whose value comes next
	for i := 0; i < len(b); i++ {
		switch c := b[i]; c {
		case '"':
			start := i + 1
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			if j := skipSpace(b, i+1); j < len(b) && b[j] == ':' {
				member = b[start:min(i, len(b))]
			}
		case '{', '[':
			kind := otlpRequest
			switch parent := &stack[depth]; {
			case depth > 0 && parent.array:
				kind = parent.frame.kind
			case depth > 0:
				kind = jsonFieldKind(parent.frame.kind, member)
			}
			if depth++; depth >= len(stack) {
				return fmt.Errorf("JSON nested deeper than %d levels", len(stack)-1)
			}
			stack[depth] = jsonContainer{array: c == '[', frame: otlpFrame{kind: kind}}
			if c == '[' {
				stack[depth].frame.objects = otlpJSONElementBytes
				if j := skipSpace(b, i+1); j < len(b) && b[j] != ']' {
					stack[depth].elements = 1
				}
			} else {
				stack[depth].frame.objects = otlpMessageBytes[kind]
			}
			member = nil
		case ',':
			if stack[depth].array {
				stack[depth].elements++
				stack[depth].frame.objects += otlpJSONElementBytes
			}
		case '}', ']':
			if depth == 0 {
				return fmt.Errorf("unbalanced JSON at byte %d", i)
			}
			done := &stack[depth]
			depth--
			// The object that holds what ended: its parent, or the
			// array's parent; the request, outside the body's object.
			holder := f
			if depth > 0 && !stack[depth].array {
				holder = &stack[depth].frame
			} else if depth > 1 {
				holder = &stack[depth-1].frame
			}
			if !done.array {
				if err := sc.finish(&done.frame); err != nil {
					return err
				}
				holder.adopt(&done.frame)
				continue
			}
			// An array: its elements' objects were adopted one by one;
			// what remains are its own costs and its numbers.
			holder.objects += done.frame.objects
			switch done.frame.kind {
			case otlpNumbers:
				holder.objects += int64(done.elements) * otlpNumberBytes
				if holder.kind == otlpBuckets {
					holder.values += int64(done.elements)
				}
			case otlpBoundList:
				holder.objects += int64(done.elements) * otlpNumberBytes
				holder.bounds += done.elements
			}
		}
	}
	if depth != 0 {
		return fmt.Errorf("unbalanced JSON: %d containers not closed", depth)
	}
	// The request's own object was adopted into f; finish it.
	return sc.finish(f)
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
