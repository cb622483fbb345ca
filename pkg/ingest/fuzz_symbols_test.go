package ingest

import (
	"fmt"
	"strings"
	"testing"

	writev2 "github.com/prometheus/prometheus/prompb/io/prometheus/write/v2"
)

// FuzzV2SymbolTable: a remote write 2.0 request built from any symbol table
// (symbols separated by NUL in the input) and any references into it (one
// per input byte, so many fall outside the table) is decoded into exactly the
// symbols its label, help and unit references name, or refused because a
// reference is out of range or the label references do not pair up; never
// a panic, a wrong label or a symbol of another request.
func FuzzV2SymbolTable(f *testing.F) {
	f.Add("\x00__name__\x00DCGM_FI_DEV_GPU_TEMP\x00gpu\x000\x00help\x00celsius", []byte{1, 2, 3, 4}, uint8(5), uint8(6))
	f.Add("", []byte{}, uint8(0), uint8(0))
	f.Add("", []byte{0, 0}, uint8(0), uint8(0))                  // no table: every label reference is out of range
	f.Add("\x00a", []byte{1, 1, 0}, uint8(0), uint8(0))          // odd number of references
	f.Add("\x00a\x00b", []byte{1, 2}, uint8(9), uint8(0))        // help out of range
	f.Add("\x00\xff\xfe\x00b", []byte{1, 2}, uint8(1), uint8(2)) // invalid UTF-8 symbol: decoded as is, validated later
	f.Add(strings.Repeat("\x00x", 300), []byte{255, 254}, uint8(200), uint8(100))
	f.Fuzz(func(t *testing.T, table string, refs []byte, help, unit uint8) {
		var syms []string
		if table != "" {
			syms = strings.Split(table, "\x00")
		}
		lr := make([]uint32, len(refs))
		for i, b := range refs {
			lr[i] = uint32(b)
		}
		req := &writev2.Request{Symbols: syms, Timeseries: []writev2.TimeSeries{{
			LabelsRefs: lr,
			Samples:    []writev2.Sample{{Value: 1, Timestamp: 1}},
			Metadata:   writev2.Metadata{Type: writev2.Metadata_METRIC_TYPE_GAUGE, HelpRef: uint32(help), UnitRef: uint32(unit)},
		}}}
		series, err := oursV2(marshalled(req))

		inRange := func(ref uint32) bool { return int(ref) < len(syms) }
		want := ""
		if len(lr)%2 == 1 {
			want = "odd number of labels_refs"
		}
		for _, r := range lr {
			if !inRange(r) && want == "" {
				want = "out of range"
			}
		}
		// A help or unit reference of 0 is the empty string even without a table.
		for _, r := range []uint32{uint32(help), uint32(unit)} {
			if !inRange(r) && !(r == 0 && len(syms) == 0) && want == "" {
				want = "out of range"
			}
		}
		if want != "" {
			if err == nil || !(strings.Contains(err.Error(), "out of range") || strings.Contains(err.Error(), "odd number of labels_refs")) {
				t.Fatalf("table %q refs %v help %d unit %d: %v, want an error (%s)", syms, lr, help, unit, err, want)
			}
			return
		}
		if err != nil {
			t.Fatalf("table %q refs %v help %d unit %d: %v", syms, lr, help, unit, err)
		}
		if len(series) != 1 {
			t.Fatalf("%d series decoded, want 1", len(series))
		}
		var wantLabels []string
		for _, r := range lr {
			wantLabels = append(wantLabels, syms[r])
		}
		if fmt.Sprintf("%q", series[0].labels) != fmt.Sprintf("%q", wantLabels) {
			t.Fatalf("labels %q, want %q", series[0].labels, wantLabels)
		}
		sym := func(r uint8) string {
			if len(syms) == 0 {
				return ""
			}
			return syms[r]
		}
		if m := series[0].meta; m[1] != sym(help) || m[2] != sym(unit) {
			t.Fatalf("help %q unit %q, want %q %q", m[1], m[2], sym(help), sym(unit))
		}
	})
}
