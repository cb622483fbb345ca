package bucketindex

import (
	"github.com/oklog/ulid/v2"

	"github.com/gpustore/gpustore/pkg/block"
)

// Replaced returns the blocks of metas whose samples another block of metas
// holds, each with the block that replaces it: B replaces A when both have
// the same resolution and A's compaction sources are a subset of B's (a
// compacted block lists the level-1 blocks it was made of, through every
// level), or A is one of B's parents. Two blocks with the same sources (a
// compaction done twice) keep the one with the greater ULID.
//
// Readers hide replaced blocks so that no sample is counted twice while a
// compacted block and its sources are both in the bucket, which lasts from
// the compacted block's upload until the sources are deleted (and forever if
// the compactor crashed before marking them).
func Replaced(metas []*block.Meta) map[ulid.ULID]ulid.ULID {
	sources := func(m *block.Meta) []ulid.ULID {
		if len(m.Compaction.Sources) == 0 {
			return []ulid.ULID{m.ULID}
		}
		return m.Compaction.Sources
	}
	type key struct {
		res int64
		src ulid.ULID
	}
	// Blocks by each of their sources, per resolution.
	holders := map[key][]*block.Meta{}
	srcSets := make(map[ulid.ULID]map[ulid.ULID]struct{}, len(metas))
	for _, m := range metas {
		set := map[ulid.ULID]struct{}{}
		for _, s := range sources(m) {
			set[s] = struct{}{}
			k := key{m.GPUStore.Downsample.Resolution, s}
			holders[k] = append(holders[k], m)
		}
		srcSets[m.ULID] = set
	}
	out := map[ulid.ULID]ulid.ULID{}
	for _, a := range metas {
		as := sources(a)
		for _, b := range holders[key{a.GPUStore.Downsample.Resolution, as[0]}] {
			if b.ULID == a.ULID || !subset(as, srcSets[b.ULID]) {
				continue
			}
			if len(srcSets[b.ULID]) == len(srcSets[a.ULID]) && b.ULID.Compare(a.ULID) < 0 {
				continue // same sources: the greater ULID stays
			}
			out[a.ULID] = b.ULID
			break
		}
	}
	// A parent is replaced by its child even if its sources are not all
	// listed in the child's meta.json.
	byID := make(map[ulid.ULID]*block.Meta, len(metas))
	for _, m := range metas {
		byID[m.ULID] = m
	}
	for _, b := range metas {
		for _, p := range b.Compaction.Parents {
			a, ok := byID[p.ULID]
			if !ok || a.ULID == b.ULID || a.GPUStore.Downsample.Resolution != b.GPUStore.Downsample.Resolution || out[b.ULID] == a.ULID {
				continue // (a child its parent replaces is a malformed pair: keep both)
			}
			if _, done := out[a.ULID]; !done {
				out[a.ULID] = b.ULID
			}
		}
	}
	return out
}

func subset(a []ulid.ULID, b map[ulid.ULID]struct{}) bool {
	for _, s := range a {
		if _, ok := b[s]; !ok {
			return false
		}
	}
	return true
}
