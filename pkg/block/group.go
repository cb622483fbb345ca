package block

import (
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/oklog/ulid/v2"
)

// GroupKey names the group of m within its tenant: the blocks with m's
// external labels (meta.json's gpustore.labels), whatever their resolution.
// A group is one receiver's blocks, or those of several receivers that
// share their external labels (replicas of one another), so their
// overlapping blocks are merged rather than read side by side.
//
// It is the one key every reader of the bucket groups by: the compactor
// compacts and downsamples within a group and one resolution, a block
// replaces only blocks of its group and resolution (bucketindex.Replaced),
// and the bucket store plans each query per group.
func GroupKey(m *Meta) string {
	var b strings.Builder
	for i, k := range slices.Sorted(maps.Keys(m.GPUStore.Labels)) {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Quote(k)) // quoted: meta.json's names are not validated
		b.WriteByte('=')
		b.WriteString(strconv.Quote(m.GPUStore.Labels[k]))
	}
	return b.String()
}

// SourceIDs are the level-1 blocks whose samples m holds (meta.json's
// compaction.sources, through every level of compaction; m itself for a
// block never compacted). Which block replaces which is decided on them.
func (m *Meta) SourceIDs() []ulid.ULID {
	if len(m.Compaction.Sources) == 0 {
		return []ulid.ULID{m.ULID}
	}
	return m.Compaction.Sources
}
