// Package seriesread reads a series set the ways the query engine does,
// into text, so that tests can compare two read paths sample for sample.
package seriesread

import (
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/prometheus/prometheus/storage"
	"github.com/prometheus/prometheus/tsdb/chunkenc"
)

// sample is one sample as an iterator gives it.
type sample struct {
	t  int64
	f  float64
	h  string
	vt chunkenc.ValueType
}

func (s sample) String() string {
	if s.vt == chunkenc.ValFloat {
		return fmt.Sprintf("%d=%v", s.t, math.Float64bits(s.f))
	}
	return fmt.Sprintf("%d=%s", s.t, s.h)
}

func at(it chunkenc.Iterator, vt chunkenc.ValueType) sample {
	switch vt {
	case chunkenc.ValFloat:
		t, f := it.At()
		return sample{t: t, f: f, vt: vt}
	case chunkenc.ValHistogram, chunkenc.ValFloatHistogram:
		t, fh := it.AtFloatHistogram(nil)
		return sample{t: t, h: fh.String(), vt: vt}
	}
	return sample{}
}

// Walk reads a series set as the engine does: every sample, or a Seek per
// step with Next in between now and then; it returns the labels and what
// each read returned.
func Walk(t testing.TB, ss storage.SeriesSet, rnd *rand.Rand, mint, maxt int64) []string {
	t.Helper()
	var out []string
	var it chunkenc.Iterator
	for ss.Next() {
		s := ss.At()
		var sb strings.Builder
		sb.WriteString(s.Labels().String())
		it = s.Iterator(it)
		if rnd == nil {
			for vt := it.Next(); vt != chunkenc.ValNone; vt = it.Next() {
				fmt.Fprintf(&sb, " %s", at(it, vt))
			}
		} else {
			step := int64(10_000 + rnd.IntN(600_000))
			for ts := mint - int64(rnd.IntN(100_000)); ts <= maxt+step; ts += step {
				vt := it.Seek(ts)
				if vt == chunkenc.ValNone {
					sb.WriteString(" end")
					break
				}
				fmt.Fprintf(&sb, " s%d:%s", ts, at(it, vt))
				if rnd.IntN(3) == 0 {
					if vt = it.Next(); vt == chunkenc.ValNone {
						sb.WriteString(" end")
						break
					}
					fmt.Fprintf(&sb, " n:%s", at(it, vt))
				}
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		out = append(out, sb.String())
	}
	if err := ss.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

