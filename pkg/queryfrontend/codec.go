package queryfrontend

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"

	jsoniter "github.com/json-iterator/go"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql"
	"github.com/prometheus/prometheus/promql/parser"
	v1 "github.com/prometheus/prometheus/web/api/v1"
)

// answer is one piece's (or a cached extent's) decoded query_range answer.
// Its matrix is sorted by labels and never modified once built: cached
// answers share their point slices with the answers cut from them.
type answer struct {
	matrix          promql.Matrix
	warnings, infos []string
}

// errNotJoinable marks an answer the frontend does not take apart: native
// histograms (the JSON form of a histogram cannot be turned back into the
// engine's exactly) or a result that is not a matrix. The request is then
// served unsplit.
var errNotJoinable = errors.New("answer cannot be joined from pieces")

// decodeAnswer reads a successful Prometheus query_range answer:
// {"status":"success","data":{"resultType":"matrix","result":[...]},"warnings":[...],"infos":[...]}.
func decodeAnswer(body []byte) (answer, error) {
	it := jsoniter.ParseBytes(jsoniter.ConfigDefault, body)
	var a answer
	status := ""
	for f := it.ReadObject(); f != ""; f = it.ReadObject() {
		switch f {
		case "status":
			status = it.ReadString()
		case "data":
			m, err := decodeData(it)
			if err != nil {
				return answer{}, err
			}
			a.matrix = m
		case "warnings":
			a.warnings = readStrings(it)
		case "infos":
			a.infos = readStrings(it)
		default:
			it.Skip()
		}
	}
	if it.Error != nil && !errors.Is(it.Error, io.EOF) {
		return answer{}, fmt.Errorf("decode query_range answer: %w", it.Error)
	}
	if status != "success" {
		return answer{}, fmt.Errorf("decode query_range answer: status %q", status)
	}
	if a.matrix == nil {
		a.matrix = promql.Matrix{}
	}
	sort.Sort(a.matrix) // the engine sorts range results by labels; keep that for the join
	return a, nil
}

func readStrings(it *jsoniter.Iterator) []string {
	var out []string
	for it.ReadArray() {
		out = append(out, it.ReadString())
	}
	return out
}

func decodeData(it *jsoniter.Iterator) (promql.Matrix, error) {
	m := promql.Matrix{}
	for f := it.ReadObject(); f != ""; f = it.ReadObject() {
		switch f {
		case "resultType":
			if t := it.ReadString(); t != string(parser.ValueTypeMatrix) {
				return nil, fmt.Errorf("%w: result type %q", errNotJoinable, t)
			}
		case "result":
			b := labels.NewScratchBuilder(0) // with its own symbol table under dedupelabels
			for it.ReadArray() {
				s, err := decodeSeries(it, &b)
				if err != nil {
					return nil, err
				}
				m = append(m, s)
			}
		default: // stats and cost are never asked for by the frontend
			it.Skip()
		}
		if it.Error != nil {
			return nil, it.Error
		}
	}
	return m, nil
}

func decodeSeries(it *jsoniter.Iterator, b *labels.ScratchBuilder) (promql.Series, error) {
	var s promql.Series
	for f := it.ReadObject(); f != ""; f = it.ReadObject() {
		switch f {
		case "metric":
			b.Reset()
			for name := it.ReadObject(); name != ""; name = it.ReadObject() {
				b.Add(name, it.ReadString())
			}
			b.Sort()
			s.Metric = b.Labels()
		case "values":
			for it.ReadArray() {
				var p promql.FPoint
				if !it.ReadArray() {
					return s, fmt.Errorf("decode point: empty pair")
				}
				p.T = int64(math.Round(it.ReadFloat64() * 1000))
				if !it.ReadArray() {
					return s, fmt.Errorf("decode point: no value")
				}
				v, err := strconv.ParseFloat(it.ReadString(), 64)
				if err != nil {
					return s, fmt.Errorf("decode point value: %w", err)
				}
				p.F = v
				if it.ReadArray() {
					return s, fmt.Errorf("decode point: more than two elements")
				}
				s.Floats = append(s.Floats, p)
			}
		case "histograms":
			if it.WhatIsNext() == jsoniter.ArrayValue {
				return s, fmt.Errorf("%w: native histograms", errNotJoinable)
			}
			it.Skip()
		default:
			it.Skip()
		}
		if it.Error != nil {
			return s, it.Error
		}
	}
	return s, nil
}

// encodeAnswer writes a as Prometheus' API does (its JSON codec, its
// response types), so a joined answer is byte for byte what the unsplit
// query would have produced, apart from the order of annotations.
func encodeAnswer(a answer) ([]byte, error) {
	return v1.JSONCodec{}.Encode(&v1.Response{
		Status:   "success",
		Data:     &v1.QueryData{ResultType: parser.ValueTypeMatrix, Result: a.matrix},
		Warnings: a.warnings,
		Infos:    a.infos,
	})
}

// join concatenates answers that cover consecutive, disjoint step ranges
// (oldest first) into one: each series' points in time order, series
// sorted by labels, annotations the union in first-seen order.
func join(parts ...answer) answer {
	switch n := len(parts); {
	case n == 0:
		return answer{matrix: promql.Matrix{}}
	case n == 1:
		return parts[0]
	}
	idx := map[uint64][]int{} // labels hash → positions in out (collisions compared by labels)
	var out promql.Matrix
	var warnings, infos []string
	for _, p := range parts {
		for _, s := range p.matrix {
			h := s.Metric.Hash()
			pos := -1
			for _, i := range idx[h] {
				if labels.Equal(out[i].Metric, s.Metric) {
					pos = i
					break
				}
			}
			if pos < 0 {
				idx[h] = append(idx[h], len(out))
				// Copy: the part's slice may be shared with the cache.
				out = append(out, promql.Series{Metric: s.Metric, Floats: slices.Clone(s.Floats)})
				continue
			}
			out[pos].Floats = append(out[pos].Floats, s.Floats...)
		}
		warnings = union(warnings, p.warnings)
		infos = union(infos, p.infos)
	}
	sort.Sort(out)
	return answer{matrix: out, warnings: warnings, infos: infos}
}

func union(a, b []string) []string {
	for _, s := range b {
		if !slices.Contains(a, s) {
			a = append(a, s)
		}
	}
	return a
}

// cut returns the part of a with steps in [from, to]; the point slices
// are shared with a.
func cut(a answer, from, to int64) answer {
	out := answer{matrix: make(promql.Matrix, 0, len(a.matrix)), warnings: a.warnings, infos: a.infos}
	for _, s := range a.matrix {
		i := sort.Search(len(s.Floats), func(i int) bool { return s.Floats[i].T >= from })
		j := sort.Search(len(s.Floats), func(i int) bool { return s.Floats[i].T > to })
		if i < j {
			out.matrix = append(out.matrix, promql.Series{Metric: s.Metric, Floats: s.Floats[i:j:j]})
		}
	}
	return out
}

// sizeOf estimates the memory an answer holds, for the cache's bound.
func sizeOf(a answer) int64 {
	n := int64(64)
	for _, s := range a.matrix {
		n += 96 + int64(len(s.Floats))*16
		s.Metric.Range(func(l labels.Label) { n += 32 + int64(len(l.Name)+len(l.Value)) })
	}
	for _, w := range a.warnings {
		n += 16 + int64(len(w))
	}
	for _, w := range a.infos {
		n += 16 + int64(len(w))
	}
	return n
}
