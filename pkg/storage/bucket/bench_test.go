package bucket

import (
	"bytes"
	"context"
	"fmt"
	"testing"

	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"
)

// BenchmarkFolderUpload: what an object upload to the folder bucket costs,
// objstore's filesystem provider (written in place, never fsynced) against
// the durable folder (temporary file, fsync, rename, directory fsync), for a
// meta.json-sized object and a chunk segment-sized one.
//
//	go test ./pkg/storage/bucket -run '^$' -bench FolderUpload -benchtime 20x
func BenchmarkFolderUpload(b *testing.B) {
	for _, size := range []int{2 << 10, 64 << 20} {
		data := bytes.Repeat([]byte{'x'}, size)
		for _, c := range []struct {
			name string
			open func(dir string) (objstore.Bucket, error)
		}{
			{"objstore", func(dir string) (objstore.Bucket, error) { return filesystem.NewBucket(dir) }},
			{"durable", func(dir string) (objstore.Bucket, error) { return newDurableFolder(dir) }},
		} {
			b.Run(fmt.Sprintf("%s/%dKiB", c.name, size>>10), func(b *testing.B) {
				bkt, err := c.open(b.TempDir())
				if err != nil {
					b.Fatal(err)
				}
				b.SetBytes(int64(size))
				for i := 0; b.Loop(); i++ {
					if err := bkt.Upload(context.Background(), fmt.Sprintf("t/%d/meta.json", i), bytes.NewReader(data)); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
