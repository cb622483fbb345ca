package hatracker

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/grafana/dskit/kv/memberlist"
)

// ReplicaDesc is the election state of one (tenant, cluster): which replica
// is elected, when it was elected, and when a write from it was last seen.
// It is the value stored in the KV store, shared by every receiver.
type ReplicaDesc struct {
	Replica string `json:"replica"`
	// ReceivedAt is the wall-clock time (ms) of the latest write from the
	// elected replica that was recorded in the store.
	ReceivedAt int64 `json:"received_at"`
	// ElectedAt is when Replica won the election (ms).
	ElectedAt int64 `json:"elected_at"`
	// Term counts the elections of the cluster: a failover's is one more
	// than the election it replaced. Two processes that elected at once
	// (before gossip carried either choice) hold the same term, and the
	// first election of the term wins when their views merge, so an
	// established replica is not replaced by a late concurrent election.
	// 0: written before terms existed (later ElectedAt wins, as then).
	Term int64 `json:"term,omitempty"`
	// DeletedAt marks a cluster that stopped writing (a tombstone), ms.
	DeletedAt int64 `json:"deleted_at,omitempty"`
}

// replicaCodec stores ReplicaDesc as JSON: the values are tiny, and JSON
// keeps them readable in memberlist's status page.
type replicaCodec struct{}

func (replicaCodec) CodecID() string { return "gpustore.hatracker.ReplicaDesc.json" }

func (replicaCodec) Decode(b []byte) (any, error) {
	d := &ReplicaDesc{}
	if err := json.Unmarshal(b, d); err != nil {
		return nil, fmt.Errorf("decode replica desc: %w", err)
	}
	return d, nil
}

func (replicaCodec) Encode(v any) ([]byte, error) {
	d, ok := v.(*ReplicaDesc)
	if !ok {
		return nil, fmt.Errorf("encode replica desc: unexpected %T", v)
	}
	return json.Marshal(d)
}

// Merge implements memberlist.Mergeable so that processes gossiping their
// views converge on one elected replica: the higher term wins (a failover
// supersedes what it replaced); within a term the earlier election (the
// replica that was elected first keeps the cluster); for the same election
// the later ReceivedAt wins; ties go to the smaller replica name so every
// node decides alike.
func (d *ReplicaDesc) Merge(other memberlist.Mergeable, _ bool) (memberlist.Mergeable, error) {
	o, ok := other.(*ReplicaDesc)
	if !ok || o == nil {
		return nil, nil
	}
	if !o.newerThan(d) {
		return nil, nil
	}
	*d = *o
	return d.Clone(), nil
}

func (d *ReplicaDesc) newerThan(x *ReplicaDesc) bool {
	switch {
	case d.Term != x.Term:
		return d.Term > x.Term
	case d.ElectedAt != x.ElectedAt && d.Term == 0:
		return d.ElectedAt > x.ElectedAt
	case d.ElectedAt != x.ElectedAt:
		return d.ElectedAt < x.ElectedAt
	case d.Replica != x.Replica:
		return d.Replica < x.Replica
	case d.ReceivedAt != x.ReceivedAt:
		return d.ReceivedAt > x.ReceivedAt
	}
	return d.DeletedAt > x.DeletedAt
}

// MergeContent implements memberlist.Mergeable.
func (d *ReplicaDesc) MergeContent() []string { return []string{d.Replica} }

// RemoveTombstones implements memberlist.Mergeable.
func (d *ReplicaDesc) RemoveTombstones(limit time.Time) (total, removed int) {
	if d.DeletedAt == 0 {
		return 0, 0
	}
	if limit.IsZero() || time.UnixMilli(d.DeletedAt).Before(limit) {
		return 0, 1
	}
	return 1, 0
}

// Clone implements memberlist.Mergeable.
func (d *ReplicaDesc) Clone() memberlist.Mergeable {
	c := *d
	return &c
}

// Codec is the KV codec of the election state; a memberlist KV that carries
// the election must have it registered.
func Codec() interface {
	Decode([]byte) (any, error)
	Encode(any) ([]byte, error)
	CodecID() string
} {
	return replicaCodec{}
}
