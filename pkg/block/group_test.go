package block

import "testing"

// TestGroupKey: the key ignores the labels' order and the resolution, and
// tells apart label sets that would print alike unquoted.
func TestGroupKey(t *testing.T) {
	meta := func(res int64, kv map[string]string) *Meta {
		return &Meta{GPUStore: GPUStoreMeta{Labels: kv, Downsample: Downsample{Resolution: res}}}
	}
	a := meta(0, map[string]string{"b": "2", "a": "1"})
	b := meta(0, map[string]string{"a": "1", "b": "2"})
	c := meta(300_000, map[string]string{"a": "1", "b": "2"})
	if GroupKey(a) != GroupKey(b) || GroupKey(a) != GroupKey(c) {
		t.Fatalf("one group, several keys: %s %s %s", GroupKey(a), GroupKey(b), GroupKey(c))
	}
	if GroupKey(meta(0, nil)) != GroupKey(meta(0, map[string]string{})) {
		t.Fatal("no labels: two keys")
	}
	for _, other := range []map[string]string{
		{"a": "1,b=2"}, {"a": `1","b="2`}, {"a": "1"}, {"a=1,b": "2"}, {"a": "1", "b": "3"},
	} {
		if GroupKey(meta(0, other)) == GroupKey(a) {
			t.Fatalf("%v shares the key of %v: %s", other, a.GPUStore.Labels, GroupKey(a))
		}
	}
}
