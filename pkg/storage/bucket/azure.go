package bucket

import (
	"context"
	"fmt"
	"io"
	"maps"
	"sync"
	"sync/atomic"

	"github.com/go-kit/log"
	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/azure"
	"gopkg.in/yaml.v3"
)

// newAzureBucket builds objstore's Azure Blob client without connecting.
//
// objstore checks for the container, and creates it when missing
// (storage_create_container, on unless set false), while it builds the
// client: with Azure out of reach gpustore would not start, and could not
// ingest, until Azure is back. gpustore builds the client with the check
// off and runs objstore's check and creation before the first operation
// instead, again at each operation until it succeeds: an outage at start-up
// delays uploads like any other outage.
func newAzureBucket(logger log.Logger, conf map[string]any) (objstore.Bucket, error) {
	create := true // objstore's default
	if v, ok := conf["storage_create_container"].(bool); ok {
		create = v
	}
	noCheck := maps.Clone(conf)
	if noCheck == nil {
		noCheck = map[string]any{}
	}
	noCheck["storage_create_container"] = false
	raw, err := yaml.Marshal(noCheck)
	if err != nil {
		return nil, err
	}
	bkt, err := azure.NewBucket(logger, raw, "gpustore", nil)
	if err != nil || !create {
		return bkt, err
	}
	withCheck, err := yaml.Marshal(conf)
	if err != nil {
		return nil, err
	}
	return &preparedBucket{Bucket: bkt, prepare: func() error {
		b, err := azure.NewBucket(logger, withCheck, "gpustore", nil)
		if err != nil {
			return fmt.Errorf("check or create Azure container: %w", err)
		}
		return b.Close()
	}}, nil
}

// preparedBucket runs prepare before the first operation that reaches the
// bucket, and again before the next one until prepare succeeds once. An
// operation fails with prepare's error until then.
type preparedBucket struct {
	objstore.Bucket
	prepare func() error
	mu      sync.Mutex // one prepare at a time
	done    atomic.Bool
}

func (b *preparedBucket) ready() error {
	if b.done.Load() {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done.Load() {
		return nil
	}
	if err := b.prepare(); err != nil {
		return err
	}
	b.done.Store(true)
	return nil
}

func (b *preparedBucket) Upload(ctx context.Context, name string, r io.Reader, opts ...objstore.ObjectUploadOption) error {
	if err := b.ready(); err != nil {
		return err
	}
	return b.Bucket.Upload(ctx, name, r, opts...)
}

func (b *preparedBucket) Delete(ctx context.Context, name string) error {
	if err := b.ready(); err != nil {
		return err
	}
	return b.Bucket.Delete(ctx, name)
}

func (b *preparedBucket) Iter(ctx context.Context, dir string, f func(string) error, opts ...objstore.IterOption) error {
	if err := b.ready(); err != nil {
		return err
	}
	return b.Bucket.Iter(ctx, dir, f, opts...)
}

func (b *preparedBucket) IterWithAttributes(ctx context.Context, dir string, f func(objstore.IterObjectAttributes) error, opts ...objstore.IterOption) error {
	if err := b.ready(); err != nil {
		return err
	}
	return b.Bucket.IterWithAttributes(ctx, dir, f, opts...)
}

func (b *preparedBucket) Get(ctx context.Context, name string) (io.ReadCloser, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	return b.Bucket.Get(ctx, name)
}

func (b *preparedBucket) GetRange(ctx context.Context, name string, off, length int64) (io.ReadCloser, error) {
	if err := b.ready(); err != nil {
		return nil, err
	}
	return b.Bucket.GetRange(ctx, name, off, length)
}

func (b *preparedBucket) Exists(ctx context.Context, name string) (bool, error) {
	if err := b.ready(); err != nil {
		return false, err
	}
	return b.Bucket.Exists(ctx, name)
}

func (b *preparedBucket) Attributes(ctx context.Context, name string) (objstore.ObjectAttributes, error) {
	if err := b.ready(); err != nil {
		return objstore.ObjectAttributes{}, err
	}
	return b.Bucket.Attributes(ctx, name)
}
