package compact

import (
	"fmt"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/prometheus/tsdb"

	"github.com/gpustore/gpustore/pkg/block"
	"github.com/gpustore/gpustore/pkg/downsample"
)

var testRanges = []int64{
	(2 * time.Hour).Milliseconds(), (8 * time.Hour).Milliseconds(),
	(48 * time.Hour).Milliseconds(), (14 * 24 * time.Hour).Milliseconds(),
}

const h = int64(time.Hour / time.Millisecond)

var seq uint64

func meta(mint, maxt int64) *block.Meta {
	seq++
	return &block.Meta{BlockMeta: blockMeta(ulid.MustNew(seq, nil), mint, maxt)}
}

func spans(ms []*block.Meta) string {
	s := ""
	for _, m := range ms {
		s += fmt.Sprintf("[%d,%d)", m.MinTime/h, m.MaxTime/h)
	}
	return s
}

func TestPlan(t *testing.T) {
	twoH := func(from, n int64) []*block.Meta {
		var out []*block.Meta
		for i := range n {
			out = append(out, meta((from+2*i)*h, (from+2*i+2)*h))
		}
		return out
	}
	cat := func(xs ...[]*block.Meta) []*block.Meta {
		var out []*block.Meta
		for _, x := range xs {
			out = append(out, x...)
		}
		return out
	}
	for _, tc := range []struct {
		name   string
		blocks []*block.Meta
		want   string
	}{
		{"one block", twoH(0, 1), ""},
		{"the newest 8h range is not whole and nothing is newer: left alone", twoH(0, 3), ""},
		{"a whole 8h range", twoH(0, 4), "[0,2)[2,4)[4,6)[6,8)"},
		{"an unfinished range followed by a newer block is finished", cat(twoH(0, 2), twoH(8, 1)), "[0,2)[2,4)"},
		{"oldest range first", cat(twoH(0, 4), twoH(8, 4)), "[0,2)[2,4)[4,6)[6,8)"},
		{"overlaps first, even in the newest range", cat(twoH(0, 4), twoH(8, 1), []*block.Meta{meta(9*h, 10*h)}), "[8,10)[9,10)"},
		{"a block uploaded twice", cat(twoH(0, 1), twoH(0, 1)), "[0,2)[0,2)"},
		{"transitive overlaps at once", []*block.Meta{meta(0, 3*h), meta(2*h, 5*h), meta(4*h, 6*h), meta(6*h, 8*h)}, "[0,3)[2,5)[4,6)"},
		{"8h blocks into 2d", cat(
			[]*block.Meta{meta(0, 8*h), meta(8*h, 16*h), meta(16*h, 24*h), meta(24*h, 32*h), meta(32*h, 40*h), meta(40*h, 48*h)},
			twoH(48, 1)), "[0,8)[8,16)[16,24)[24,32)[32,40)[40,48)"},
		{"2h blocks below 8h before 8h into 2d", cat(
			[]*block.Meta{meta(0, 8*h), meta(8*h, 16*h)}, twoH(16, 4), twoH(48, 1)), "[16,18)[18,20)[20,22)[22,24)"},
		{"a block crossing the range boundary stays out", []*block.Meta{meta(6*h, 10*h), meta(10*h, 12*h), meta(12*h, 14*h), meta(14*h, 16*h), meta(16*h, 18*h)}, "[10,12)[12,14)[14,16)"},
		{"whole 14d range is the top level", func() []*block.Meta {
			var out []*block.Meta
			for d := int64(0); d < 14; d += 2 {
				out = append(out, meta(d*24*h, (d+2)*24*h))
			}
			return out
		}(), "[0,48)[48,96)[96,144)[144,192)[192,240)[240,288)[288,336)"},
		{"a 14d block is never planned again", cat([]*block.Meta{meta(0, 336*h)}, twoH(336, 1)), ""},
		{"negative times align like positive ones", []*block.Meta{meta(-8*h, -6*h), meta(-6*h, -4*h), meta(-4*h, -2*h), meta(-2*h, 0)}, "[-8,-6)[-6,-4)[-4,-2)[-2,0)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := spans(Plan(tc.blocks, testRanges)); got != tc.want {
				t.Fatalf("plan %s, want %s", got, tc.want)
			}
		})
	}
}

// TestGroupOf: a compaction group is one group at one resolution.
func TestGroupOf(t *testing.T) {
	a := &block.Meta{GPUStore: block.GPUStoreMeta{Labels: map[string]string{"b": "2", "a": "1"}}}
	b := &block.Meta{GPUStore: block.GPUStoreMeta{Labels: map[string]string{"a": "1", "b": "2"}}}
	c := &block.Meta{GPUStore: block.GPUStoreMeta{Labels: map[string]string{"a": "1", "b": "2"}, Downsample: block.Downsample{Resolution: downsample.Res5m}}}
	d := &block.Meta{GPUStore: block.GPUStoreMeta{Labels: map[string]string{"a": "1,b=2"}}}
	if groupOf(a) != groupOf(b) {
		t.Fatal("label order changes the group")
	}
	if groupOf(a) == groupOf(c) || groupOf(a) == groupOf(d) {
		t.Fatalf("distinct groups share a key: %s %s %s", groupOf(a), groupOf(c), groupOf(d))
	}
}

func blockMeta(id ulid.ULID, mint, maxt int64) tsdb.BlockMeta {
	return tsdb.BlockMeta{ULID: id, MinTime: mint, MaxTime: maxt, Version: 1,
		Compaction: tsdb.BlockMetaCompaction{Level: 1, Sources: []ulid.ULID{id}}}
}
