package block

import (
	"context"
	"errors"
	"strings"
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

// TestTornMarks: a mark that does not parse (empty, or cut short) is an
// ErrBadMark of that block, and a deletion mark that does not parse is
// replaced by the next WriteDeletionMark.
func TestTornMarks(t *testing.T) {
	ctx := context.Background()
	bkt := objstore.NewInMemBucket()
	id := ulid.MustNew(1, nil)
	for _, torn := range []string{"", `{"id":"01`} {
		for _, name := range []string{DeletionMarkFilename, NoCompactMarkFilename} {
			if err := bkt.Upload(ctx, ObjectName("t", id, name), strings.NewReader(torn)); err != nil {
				t.Fatal(err)
			}
		}
		if m, err := ReadDeletionMark(ctx, bkt, "t", id); m != nil || !errors.Is(err, ErrBadMark) {
			t.Errorf("deletion mark %q: %v, %v; want ErrBadMark", torn, m, err)
		}
		if m, err := ReadNoCompactMark(ctx, bkt, "t", id); m != nil || !errors.Is(err, ErrBadMark) {
			t.Errorf("no-compact mark %q: %v, %v; want ErrBadMark", torn, m, err)
		}
		if err := WriteDeletionMark(ctx, bkt, "t", id, "retention 1d", time.Unix(2000, 0)); err != nil {
			t.Fatalf("marking a block whose deletion mark is %q: %v", torn, err)
		}
		if m, err := ReadDeletionMark(ctx, bkt, "t", id); err != nil || m == nil || m.DeletionTime != 2000 {
			t.Errorf("deletion mark after rewriting %q: %+v, %v", torn, m, err)
		}
	}
}
