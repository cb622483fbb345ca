package ingest

import (
	"fmt"
	"net/http"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
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
// otlpShape refuses nesting deeper than any exporter sends, and estimates
// from the wire what pdata will allocate, so the in-flight bound
// (ingest.max_inflight_bytes) holds the objects a request will make, not
// only its bytes.

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
	otlpNumbers // a repeated number or string field (packed or not)
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
	otlpHistogramPoint:    {9: otlpKeyValue, 6: otlpNumbers, 7: otlpNumbers, 8: otlpExemplar},
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
}

// otlpNumberBytes is what a repeated number or string field costs per
// byte on the wire: a packed varint is one byte per 8-byte element, a
// string two bytes per 16-byte header, and slices grow by doubling
// (measured 33 for packed bucket counts, 39 for strings).
const otlpNumberBytes = 48

// otlpObjectBytes returns what pdata will allocate decoding body, or a 400
// for a body nested deeper than maxOTLPDepth or not well formed.
func otlpObjectBytes(body []byte, asJSON bool) (int64, error) {
	var n int64
	var err error
	if asJSON {
		n, err = jsonObjectBytes(body)
	} else {
		n, err = protoObjectBytes(body, otlpRequest, 1)
	}
	if err != nil {
		return 0, &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf("decode OTLP metrics export request: %v", err)}
	}
	// Strings are copied out of the body.
	return n + int64(len(body)), nil
}

// protoObjectBytes walks a message of kind k at depth and sums what its
// messages cost.
func protoObjectBytes(b []byte, k otlpKind, depth int) (int64, error) {
	if depth > maxOTLPDepth {
		return 0, fmt.Errorf("messages nested deeper than %d levels", maxOTLPDepth)
	}
	n := otlpMessageBytes[k]
	for len(b) > 0 {
		num, typ, tag := protowire.ConsumeTag(b)
		if tag < 0 {
			return 0, protowire.ParseError(tag)
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
			return 0, protowire.ParseError(l)
		}
		b = b[l:]
		switch child := fieldKind(k, num); {
		case child == otlpNumbers:
			n += int64(tag+l) * otlpNumberBytes
		case child != otlpLeaf && typ == protowire.BytesType:
			c, err := protoObjectBytes(v, child, depth+1)
			if err != nil {
				return 0, err
			}
			n += c
		}
	}
	return n, nil
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

// otlpJSONMembers prices a JSON object (or array of objects) by the member
// name that holds it, in pdata's two spellings (lowerCamelCase and
// snake_case, compared without '_' and case); an object under any other
// name costs as much as the costliest message.
var otlpJSONMembers = map[string]otlpKind{
	"resourcemetrics": otlpResourceMetrics, "scopemetrics": otlpScopeMetrics, "instrumentationlibrarymetrics": otlpScopeMetrics,
	"resource": otlpResource, "scope": otlpScope, "metrics": otlpMetric,
	"gauge": otlpNumberPoints, "sum": otlpNumberPoints, "histogram": otlpHistogram,
	"exponentialhistogram": otlpExpHistogram, "summary": otlpSummary,
	"exemplars": otlpExemplar, "quantilevalues": otlpQuantile, "entityrefs": otlpEntityRef,
	"attributes": otlpKeyValue, "filteredattributes": otlpKeyValue, "metadata": otlpKeyValue,
	"values": otlpKeyValue, // a list's key-values or an array's values: the dearer
	"value":  otlpAnyValue, "arrayvalue": otlpArray, "kvlistvalue": otlpKeyValueList,
	"positive": otlpBuckets, "negative": otlpBuckets,
	"datapoints": otlpExpHistogramPoint, // the dearest point
}

// otlpJSONMaxObject is what an object under an unknown name costs.
var otlpJSONMaxObject = slices.Max(otlpMessageBytes[:])

// otlpJSONElementBytes is what an array element that is not an object (a
// bucket count, a bound, an entity key) costs: one element of at least two
// bytes (",0") as a string header or a number, with the slice's doubling.
const otlpJSONElementBytes = 2 * otlpNumberBytes

func jsonMemberCost(name []byte) int64 {
	key := strings.ToLower(strings.ReplaceAll(string(name), "_", ""))
	if k, ok := otlpJSONMembers[key]; ok {
		return otlpMessageBytes[k]
	}
	return otlpJSONMaxObject
}

// jsonObjectBytes scans a JSON body's structure (objects, arrays, member
// names) without decoding it: its depth, and its objects priced by the
// member that holds them.
func jsonObjectBytes(b []byte) (int64, error) {
	// JSON nests two levels per message (an object, the array holding it).
	type container struct {
		array bool
		cost  int64 // of an object in the array
	}
	var stack [2*maxOTLPDepth + 1]container
	var n int64
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
			cost := otlpMessageBytes[otlpRequest]
			switch {
			case depth > 0 && stack[depth].array:
				cost = stack[depth].cost
			case depth > 0:
				cost = jsonMemberCost(member)
			}
			if depth++; depth >= len(stack) {
				return 0, fmt.Errorf("JSON nested deeper than %d levels", len(stack)-1)
			}
			stack[depth] = container{array: c == '[', cost: cost}
			if c == '{' {
				n += cost
			} else {
				n += otlpJSONElementBytes
			}
			member = nil
		case '}', ']':
			if depth == 0 {
				return 0, fmt.Errorf("unbalanced JSON at byte %d", i)
			}
			depth--
		case ',':
			if stack[depth].array {
				n += otlpJSONElementBytes
			}
		}
	}
	return n, nil
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}
