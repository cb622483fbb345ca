package bucketindex

import (
	"github.com/oklog/ulid/v2"

	"github.com/gpustore/gpustore/pkg/block"
)

// Replaced returns the blocks of metas whose samples another block of metas
// holds, each with the block that replaces it. It is the one replacement
// rule: the compactor marks for deletion what it returns, and readers hide
// what it returns, so that the block a reader keeps is the block the
// compactor keeps.
//
// B replaces A when both are of one group (block.GroupKey) and one
// resolution, and A's compaction sources are a subset of B's (a compacted
// block lists the level-1 blocks it was made of, through every level), or A
// is one of B's parents. Of two blocks with the same sources (a compaction
// done twice, or a block rewritten with its sources kept) the one with the
// greater ULID, the newer, stays: a rewrite's result replaces what it
// rewrote, as a child replaces its parent.
//
// Readers hide replaced blocks so that no sample is counted twice while a
// compacted block and its sources are both in the bucket, which lasts from
// the compacted block's upload until the sources are deleted (and forever if
// the compactor crashed before marking them).
func Replaced(metas []*block.Meta) map[ulid.ULID]ulid.ULID {
	type key struct {
		res   int64
		group string
		src   ulid.ULID
	}
	groups := make(map[ulid.ULID]string, len(metas))
	// Blocks by each of their sources, per group and resolution.
	holders := map[key][]*block.Meta{}
	srcSets := make(map[ulid.ULID]map[ulid.ULID]struct{}, len(metas))
	for _, m := range metas {
		groups[m.ULID] = block.GroupKey(m)
		set := map[ulid.ULID]struct{}{}
		for _, s := range m.SourceIDs() {
			set[s] = struct{}{}
			k := key{m.GPUStore.Downsample.Resolution, groups[m.ULID], s}
			holders[k] = append(holders[k], m)
		}
		srcSets[m.ULID] = set
	}
	out := map[ulid.ULID]ulid.ULID{}
	for _, a := range metas {
		as := a.SourceIDs()
		for _, b := range holders[key{a.GPUStore.Downsample.Resolution, groups[a.ULID], as[0]}] {
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
			if !ok || a.ULID == b.ULID || a.GPUStore.Downsample.Resolution != b.GPUStore.Downsample.Resolution ||
				groups[a.ULID] != groups[b.ULID] || out[b.ULID] == a.ULID {
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
