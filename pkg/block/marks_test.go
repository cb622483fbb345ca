package block

import (
	"context"
	"testing"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/thanos-io/objstore"
)

func TestMarksRoundTrip(t *testing.T) {
	ctx := context.Background()
	bkt := objstore.NewInMemBucket()
	id := ulid.MustNew(1, nil)
	if m, err := ReadDeletionMark(ctx, bkt, "t", id); m != nil || err != nil {
		t.Fatalf("unmarked block: mark %v err %v", m, err)
	}
	first := time.Unix(1000, 0)
	if err := WriteDeletionMark(ctx, bkt, "t", id, "compacted", first); err != nil {
		t.Fatal(err)
	}
	// A second mark must not restart the delete delay.
	if err := WriteDeletionMark(ctx, bkt, "t", id, "again", first.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	m, err := ReadDeletionMark(ctx, bkt, "t", id)
	if err != nil || m == nil || m.DeletionTime != 1000 || m.Details != "compacted" || m.ID != id {
		t.Fatalf("deletion mark %+v err %v", m, err)
	}
	if err := WriteNoCompactMark(ctx, bkt, "t", id, "index-read-failure", "boom", first); err != nil {
		t.Fatal(err)
	}
	nc, err := ReadNoCompactMark(ctx, bkt, "t", id)
	if err != nil || nc == nil || nc.Reason != "index-read-failure" || nc.NoCompactTime != 1000 {
		t.Fatalf("no-compact mark %+v err %v", nc, err)
	}
}
