package bucketstore

import (
	"testing"
	"time"

	"github.com/gpustore/gpustore/pkg/deletion"
)

// A tenant's deletion requests apply to the queries of the times they
// delete from (and a margin around, for the windows a select reads beyond
// its range); other queries read the blocks as they are, unwrapped.
func TestDeletionsOverAQuerysRange(t *testing.T) {
	s := &Store{}
	const h = 3600_000
	r, err := deletion.New([]string{`{pod="alice"}`}, 10*h, 20*h, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	s.AddDeletion("t", r)
	s.AddDeletion("t", r) // once only
	if got := s.Deletions("t"); len(got) != 1 {
		t.Fatalf("requests %v, want the one added", got)
	}
	for _, c := range []struct {
		mint, maxt int64
		want       int
	}{
		{0, 5 * h, 0}, {0, 9 * h, 1}, {12 * h, 13 * h, 1}, {21 * h, 22 * h, 1}, {23 * h, 30 * h, 0},
	} {
		if got := len(s.dels.over("t", c.mint, c.maxt)); got != c.want {
			t.Errorf("query of [%dh, %dh]: %d requests, want %d", c.mint/h, c.maxt/h, got, c.want)
		}
	}
	if got := s.dels.over("other", 0, 30*h); len(got) != 0 {
		t.Errorf("another tenant's query: %v", got)
	}
}
