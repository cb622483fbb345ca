package gpusim

import (
	"fmt"
	"math"
	"strconv"
)

// Prometheus text exposition format 0.0.4, written by hand into a reused
// buffer: each series' `name{labels} ` prefix is built once per label set and
// kept, so a page costs one float format per series.

// TextContentType is the Content-Type of the pages.
const TextContentType = "text/plain; version=0.0.4; charset=utf-8"

// AppendText appends the whole cluster's page (all nodes and the cluster
// scope) as of the last Step.
func (c *Cluster) AppendText(dst []byte) []byte {
	sets := make([]*seriesSet, 0, len(c.nodes)+1)
	for _, n := range c.nodes {
		sets = append(sets, &n.set)
	}
	return appendSetsText(dst, append(sets, &c.cset))
}

// AppendNodeText appends node i's page (DCGM, node-exporter, cAdvisor and
// training series) as of its last step.
func (c *Cluster) AppendNodeText(dst []byte, i int) ([]byte, error) {
	if i < 0 || i >= len(c.nodes) {
		return dst, fmt.Errorf("node page %d: %w", i, ErrUnknownNode)
	}
	return appendSetsText(dst, []*seriesSet{&c.nodes[i].set}), nil
}

// AppendClusterScopeText appends the cluster-scope page (kube-state-metrics).
func (c *Cluster) AppendClusterScopeText(dst []byte) []byte {
	return appendSetsText(dst, []*seriesSet{&c.cset})
}

func appendSetsText(dst []byte, sets []*seriesSet) []byte {
	for f := 0; f < numFamilies; f++ {
		n := 0
		for _, s := range sets {
			n += len(s.fams[f].vals)
		}
		if n == 0 {
			continue
		}
		d := &Catalogue[f]
		dst = append(dst, "# HELP "...)
		dst = append(dst, d.Name...)
		dst = append(dst, ' ')
		dst = appendEscaped(dst, d.Help, false)
		dst = append(dst, "\n# TYPE "...)
		dst = append(dst, d.Name...)
		dst = append(dst, ' ')
		dst = append(dst, d.Type.String()...)
		dst = append(dst, '\n')
		for _, s := range sets {
			fs := &s.fams[f]
			for i := range fs.vals {
				sl := &fs.slots[i]
				if sl.text == nil {
					sl.text = slotText(sl.labels)
				}
				dst = append(dst, sl.text...)
				dst = appendValue(dst, fs.vals[i])
				dst = append(dst, '\n')
			}
		}
	}
	return dst
}

func slotText(ls []Label) []byte {
	var name string
	for _, l := range ls {
		if l.Name == "__name__" {
			name = l.Value
		}
	}
	b := make([]byte, 0, 64+len(ls)*32)
	b = append(b, name...)
	b = appendLabelsText(b, ls)
	return append(b, ' ')
}

// appendLabelsText appends {a="b",...} without __name__.
func appendLabelsText(b []byte, ls []Label) []byte {
	first := true
	for _, l := range ls {
		if l.Name == "__name__" {
			continue
		}
		if first {
			b = append(b, '{')
			first = false
		} else {
			b = append(b, ',')
		}
		b = append(b, l.Name...)
		b = append(b, '=', '"')
		b = appendEscaped(b, l.Value, true)
		b = append(b, '"')
	}
	if !first {
		b = append(b, '}')
	}
	return b
}

// appendEscaped escapes backslash and newline (and '"' in label values), as
// the text format requires.
func appendEscaped(b []byte, s string, quote bool) []byte {
	for i := 0; i < len(s); i++ {
		switch ch := s[i]; {
		case ch == '\\':
			b = append(b, '\\', '\\')
		case ch == '\n':
			b = append(b, '\\', 'n')
		case ch == '"' && quote:
			b = append(b, '\\', '"')
		default:
			b = append(b, ch)
		}
	}
	return b
}

func appendValue(b []byte, v float64) []byte {
	switch {
	case math.IsNaN(v):
		return append(b, "NaN"...)
	case math.IsInf(v, 1):
		return append(b, "+Inf"...)
	case math.IsInf(v, -1):
		return append(b, "-Inf"...)
	case v == math.Trunc(v) && math.Abs(v) < 1e15:
		return strconv.AppendInt(b, int64(v), 10)
	}
	return strconv.AppendFloat(b, v, 'g', -1, 64)
}
