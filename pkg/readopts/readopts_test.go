package readopts

import (
	"context"
	"testing"

	"github.com/oklog/ulid/v2"
)

// A read whose context carries no options (a peer's read, remote read)
// gets the defaults: no deduplication, each select picks its resolution,
// nothing served locally; the zero value would read raw data only and
// force the whole range raw.
func TestFromContextWithoutOptionsIsDefault(t *testing.T) {
	o := FromContext(context.Background())
	if o.ReplicaLabels != nil || o.MaxSourceResolution != AutoResolution || o.AtSteps || o.QueryLabels != nil ||
		o.LocalBlocks != nil || o.LocalFrom != NoLocalFrom {
		t.Errorf("options of a context without any: %+v, want %+v", o, Default())
	}
	if o.Local(ulid.MustNew(1, nil)) {
		t.Error("a block served locally without LocalBlocks")
	}
}

// The request's options come back as set; what the caller serves itself is
// the query path's to set per source, never the request's.
func TestFromContextKeepsTheRequestsOptionsOnly(t *testing.T) {
	id := ulid.MustNew(1, nil)
	in := ReadOptions{ReplicaLabels: []string{"replica"}, MaxSourceResolution: 300_000, AtSteps: true, QueryLabels: []string{"pod"},
		LocalBlocks: func(ulid.ULID) bool { return true }, LocalFrom: 42}
	o := FromContext(NewContext(context.Background(), in))
	if len(o.ReplicaLabels) != 1 || o.ReplicaLabels[0] != "replica" || o.MaxSourceResolution != 300_000 || !o.AtSteps ||
		len(o.QueryLabels) != 1 || o.QueryLabels[0] != "pod" {
		t.Errorf("request's options %+v, want %+v", o, in)
	}
	if o.LocalBlocks != nil || o.LocalFrom != NoLocalFrom || o.Local(id) {
		t.Errorf("local options carried through the context: LocalFrom %d, LocalBlocks set %v", o.LocalFrom, o.LocalBlocks != nil)
	}
}
