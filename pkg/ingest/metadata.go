package ingest

import (
	"bytes"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
)

// Metadata (type, help, unit per metric family) goes to the tenant's
// metadata store, not the TSDB. 1.0 sends it per family at the end of the
// request (or alone, in requests of metadata only), 2.0 with each series.
//
// A tenant's metadata is bounded: family names must be valid metric names
// (UTF-8, at most max_label_value_length bytes), help and unit at most
// max_metadata_length bytes, and the tenant keeps at most
// max_metadata_families families (new ones past it are refused, known ones
// updated). Five 4 MB metadata-only requests took the heap from 17 to 466
// MB before. What is refused is counted
// (gpustore_ingest_rejected_metadata_total); a 1.0 request's refused
// entries are answered 400 with the rest of the request stored, as rejected
// samples are. 2.0 and OTLP carry metadata with every series, whose samples
// decide the answer: their refused metadata is counted only.

// Reasons metadata is refused; they name the label of
// gpustore_ingest_rejected_metadata_total.
const (
	reasonMetadataFamilies = "max_metadata_families"
	reasonMetadataLength   = "metadata_too_long"
	reasonMetadataName     = "invalid_metadata_name"
)

var metadataReasons = []string{reasonMetadataFamilies, reasonMetadataLength, reasonMetadataName}

// appendMetadataV1 stores the metadata of a 1.0 request.
func (w *writeRequest) appendMetadataV1(raws [][]byte) error {
	m := &w.ac.v1meta
	for _, raw := range raws {
		m.Reset()
		if err := m.Unmarshal(raw); err != nil {
			return fmt.Errorf("%w: metadata: %v", errMalformed, err)
		}
		if m.MetricFamilyName == "" {
			continue
		}
		md := metadata.Metadata{Type: metricTypeFromWire(int32(m.Type)), Help: m.Help, Unit: m.Unit}
		if reason, err := w.setMetadata(m.MetricFamilyName, md); err != nil {
			w.stats.rejectMetadata(reason, err)
		}
	}
	return nil
}

// setMetadataOfSeries stores a 2.0 series' metadata under its family.
func (w *writeRequest) setMetadataOfSeries(s *decodedSeries) {
	var name []byte
	for _, p := range s.labels {
		if bytes.Equal(p.name, nameLabel) {
			name = p.value
			break
		}
	}
	if len(name) == 0 {
		return
	}
	typ := metricTypeFromWire(s.meta.typ)
	md := metadata.Metadata{Type: typ, Help: string(s.meta.help), Unit: string(s.meta.unit)}
	if reason, err := w.setMetadata(familyName(string(name), typ), md); err != nil {
		w.tenant.m.rejectedMetadata[reason].Inc()
	}
}

// setMetadata checks a family's metadata against the tenant's limits and
// stores it; a refusal says why (its reason and error).
func (w *writeRequest) setMetadata(family string, m metadata.Metadata) (string, error) {
	lim := w.lim
	switch {
	case !utf8.ValidString(family) || len(family) > lim.MaxLabelValueLength:
		return reasonMetadataName, fmt.Errorf("metric family name %.64q is not a valid metric name (UTF-8, at most max_label_value_length, %d bytes)", family, lim.MaxLabelValueLength)
	case len(m.Help) > lim.MaxMetadataLength || len(m.Unit) > lim.MaxMetadataLength:
		return reasonMetadataLength, fmt.Errorf("metric family %.64q has a help of %d bytes and a unit of %d, more than max_metadata_length (%d)", family, len(m.Help), len(m.Unit), lim.MaxMetadataLength)
	case !w.tenant.md.set(family, m, lim.MaxMetadataFamilies):
		return reasonMetadataFamilies, fmt.Errorf("metric family %.64q is new and tenant %q keeps the metadata of max_metadata_families (%d) families already", family, w.tenant.id, lim.MaxMetadataFamilies)
	}
	return "", nil
}

// metadataSink records per-family metadata into a tenant's store: set
// stores it unless the store keeps maxFamilies families already (0: no
// bound) and it is a new one.
type metadataSink struct {
	set func(family string, m metadata.Metadata, maxFamilies int) bool
}

// metadataBounder is a TenantStore that bounds its families itself (the
// tenants' own databases); a store that forwards metadata (the ring's
// distributor) leaves the bound to the receivers that keep it.
type metadataBounder interface {
	SetMetadataBounded(family string, m metadata.Metadata, maxFamilies int) bool
}

func newMetadataSink(ts TenantStore) *metadataSink {
	if b, ok := ts.(metadataBounder); ok {
		return &metadataSink{set: b.SetMetadataBounded}
	}
	return &metadataSink{set: func(family string, m metadata.Metadata, _ int) bool {
		ts.SetMetadata(family, m)
		return true
	}}
}

// metricTypeFromWire converts the wire enum; 1.0 and 2.0 number the types alike.
func metricTypeFromWire(t int32) model.MetricType {
	switch prompb.MetricMetadata_MetricType(t) {
	case prompb.MetricMetadata_COUNTER:
		return model.MetricTypeCounter
	case prompb.MetricMetadata_GAUGE:
		return model.MetricTypeGauge
	case prompb.MetricMetadata_HISTOGRAM:
		return model.MetricTypeHistogram
	case prompb.MetricMetadata_GAUGEHISTOGRAM:
		return model.MetricTypeGaugeHistogram
	case prompb.MetricMetadata_SUMMARY:
		return model.MetricTypeSummary
	case prompb.MetricMetadata_INFO:
		return model.MetricTypeInfo
	case prompb.MetricMetadata_STATESET:
		return model.MetricTypeStateset
	}
	return model.MetricTypeUnknown
}

// familyName strips the suffixes a histogram or summary adds to its series.
func familyName(name string, typ model.MetricType) string {
	switch typ {
	case model.MetricTypeHistogram, model.MetricTypeGaugeHistogram, model.MetricTypeSummary:
		for _, suf := range []string{"_bucket", "_count", "_sum", "_created"} {
			if strings.HasSuffix(name, suf) {
				return strings.TrimSuffix(name, suf)
			}
		}
	case model.MetricTypeCounter:
		return strings.TrimSuffix(name, "_created")
	}
	return name
}
