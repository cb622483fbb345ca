package gpusim

import "time"

// LookupMetric returns the family of a series name. Histogram series
// (_bucket, _sum, _count) resolve to their histogram family.
func LookupMetric(name string) (*MetricDesc, bool) {
	if d, ok := catalogueByName[name]; ok {
		return d, true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if len(name) > len(suf) && name[len(name)-len(suf):] == suf {
			if d, ok := catalogueByName[name[:len(name)-len(suf)]]; ok && d.Type == Histogram {
				return d, true
			}
		}
	}
	return nil, false
}

// AppendNodeSamples appends the samples of node i from its last step.
func (c *Cluster) AppendNodeSamples(buf []Series, i int, t time.Time, r Replica) []Series {
	return appendSet(buf, &c.nodes[i].set, t.Add(r.Offset).UnixMilli(), r.Jitter, h2(strHash(r.Name), uint64(t.UnixMilli())))
}

// DCGMFamilies returns the DCGM families this cluster emits for a GPU not
// in MIG mode, in emission order.
func (c *Cluster) DCGMFamilies() []*MetricDesc {
	var out []*MetricDesc
	for i := range Catalogue {
		d := &Catalogue[i]
		if d.Source != SourceDCGM || !c.emitsFamily(d.ID) {
			continue
		}
		out = append(out, d)
	}
	return out
}

// emitsFamily reports whether a GPU of this cluster (not in MIG mode) has a
// series of DCGM family f.
func (c *Cluster) emitsFamily(f int) bool {
	switch {
	case c.famOff != nil && c.famOff[f]:
		return false
	case f == FamGetGPURecoveryAction || f == FamGPURecoveryAction:
		return f == c.famRecov
	case f >= FamNVL5RxErrors && f <= FamNVLinkECCDataErrors:
		return c.hw.nvlink5
	case f == FamNVLinkCRCFlitErrors || (f >= FamNVLinkCRCDataErrors && f <= FamNVLinkRecoveryErrors):
		return !c.hw.nvlink5
	}
	return true
}
