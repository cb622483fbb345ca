package block

import (
	"context"
	"errors"
	"maps"
	"strings"
	"testing"

	"github.com/oklog/ulid/v2"
	"github.com/prometheus/common/model"
	"github.com/thanos-io/objstore"
)

// TestTypesRoundTrip: a block without types reads as none; types written
// read back; none are written for empty types; an object that does not
// parse is ErrBadTypes; Merge lets the newer block's type win.
func TestTypesRoundTrip(t *testing.T) {
	ctx := context.Background()
	bkt := objstore.NewInMemBucket()
	id := ulid.MustNew(1, nil)
	if got, err := ReadTypes(ctx, bkt, "t", id); got != nil || err != nil {
		t.Fatalf("no types object: %v, %v", got, err)
	}
	if err := WriteTypes(ctx, bkt, "t", id, Types{}); err != nil || len(bkt.Objects()) != 0 {
		t.Fatalf("empty types: %v, objects %v", err, bkt.Objects())
	}
	want := Types{"DCGM_FI_DEV_POWER_VIOLATION": model.MetricTypeCounter, "DCGM_FI_DEV_GPU_TEMP": model.MetricTypeGauge}
	if err := WriteTypes(ctx, bkt, "t", id, want); err != nil {
		t.Fatal(err)
	}
	if got, err := ReadTypes(ctx, bkt, "t", id); err != nil || !maps.Equal(got, want) {
		t.Fatalf("read back %v, %v; want %v", got, err, want)
	}
	for _, torn := range []string{"", `{"version":1,"types":{"a`, `{"version":2,"types":{}}`} {
		if err := bkt.Upload(ctx, ObjectName("t", id, TypesFilename), strings.NewReader(torn)); err != nil {
			t.Fatal(err)
		}
		if got, err := ReadTypes(ctx, bkt, "t", id); got != nil || !errors.Is(err, ErrBadTypes) {
			t.Errorf("%q: %v, %v; want ErrBadTypes", torn, got, err)
		}
	}
	merged := Types(nil).Merge(Types{"x": model.MetricTypeGauge, "y": model.MetricTypeGauge}).Merge(Types{"x": model.MetricTypeCounter})
	if typ, ok := merged.Lookup("x"); !ok || typ != model.MetricTypeCounter || len(merged) != 2 {
		t.Errorf("merged %v", merged)
	}
}
