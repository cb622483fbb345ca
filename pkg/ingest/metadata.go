package ingest

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/metadata"
	"github.com/prometheus/prometheus/prompb"
)

// Metadata (type, help, unit per metric family) goes to the tenant's
// metadata store, not the TSDB. 1.0 sends it per family at the end of the
// request, 2.0 with each series.

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
		w.tenant.md.set(m.MetricFamilyName, metadata.Metadata{Type: metricTypeFromWire(int32(m.Type)), Help: m.Help, Unit: m.Unit})
	}
	return nil
}

// metadataSink records per-family metadata into a tenant's store.
type metadataSink struct {
	set func(family string, m metadata.Metadata)
}

func (m *metadataSink) setFromSeries(s *decodedSeries) {
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
	m.set(familyName(string(name), typ), metadata.Metadata{Type: typ, Help: string(s.meta.help), Unit: string(s.meta.unit)})
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
