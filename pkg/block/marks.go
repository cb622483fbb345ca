package block

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/oklog/ulid/v2"
	"github.com/thanos-io/objstore"
)

// Marks are small JSON objects beside a block's meta.json that change what
// readers and the compactor do with the block, without touching the block.
// Their file names and fields are those Thanos uses, so Thanos' tools read a
// gpustore bucket's marks the same way.
const (
	// DeletionMarkFilename marks a block for deletion: readers stop using it
	// once a block replacing it is visible (or at once, for retention), and
	// the compactor deletes it after the delete delay.
	DeletionMarkFilename = "deletion-mark.json"
	// NoCompactMarkFilename excludes a block from compaction (it failed to
	// read); queries still read it.
	NoCompactMarkFilename = "no-compact-mark.json"
)

// MarkVersion is the version of both mark formats.
const MarkVersion = 1

// DeletionMark is deletion-mark.json.
type DeletionMark struct {
	ID      ulid.ULID `json:"id"`
	Version int       `json:"version"`
	// Details says why (e.g. "compacted into <ULID>", "retention 30d").
	Details string `json:"details,omitempty"`
	// DeletionTime is when the mark was written, in Unix seconds.
	DeletionTime int64 `json:"deletion_time"`
}

// NoCompactMark is no-compact-mark.json.
type NoCompactMark struct {
	ID      ulid.ULID `json:"id"`
	Version int       `json:"version"`
	// Reason is a short machine-readable word ("index-read-failure", ...).
	Reason string `json:"reason"`
	// Details is the error text.
	Details string `json:"details,omitempty"`
	// NoCompactTime is when the mark was written, in Unix seconds.
	NoCompactTime int64 `json:"no_compact_time"`
}

// ErrBadMark is wrapped by the errors of ReadDeletionMark and
// ReadNoCompactMark for a mark that was read but does not parse: empty or
// torn (written by a process that died, on a store that is not atomic).
// Readers treat it as a fault of that block's mark only, never of the
// tenant: a deletion mark as absent (the compactor marks the block again if
// it still should be), a no-compact mark as present (it exists).
var ErrBadMark = errors.New("bad mark")

// WriteDeletionMark writes the deletion mark of a tenant's block. Writing it
// again keeps the first mark's time, so the delete delay is never restarted;
// a mark that does not parse is replaced.
func WriteDeletionMark(ctx context.Context, bkt objstore.Bucket, tenant string, id ulid.ULID, details string, now time.Time) error {
	if m, err := ReadDeletionMark(ctx, bkt, tenant, id); err == nil && m != nil {
		return nil
	} else if err != nil && !errors.Is(err, ErrBadMark) {
		return err
	}
	return writeMark(ctx, bkt, ObjectName(tenant, id, DeletionMarkFilename),
		DeletionMark{ID: id, Version: MarkVersion, Details: details, DeletionTime: now.Unix()})
}

// WriteNoCompactMark writes the no-compact mark of a tenant's block.
func WriteNoCompactMark(ctx context.Context, bkt objstore.Bucket, tenant string, id ulid.ULID, reason, details string, now time.Time) error {
	return writeMark(ctx, bkt, ObjectName(tenant, id, NoCompactMarkFilename),
		NoCompactMark{ID: id, Version: MarkVersion, Reason: reason, Details: details, NoCompactTime: now.Unix()})
}

// ReadDeletionMark returns the block's deletion mark, or nil without error
// when it has none.
func ReadDeletionMark(ctx context.Context, bkt objstore.BucketReader, tenant string, id ulid.ULID) (*DeletionMark, error) {
	var m DeletionMark
	ok, err := readMark(ctx, bkt, ObjectName(tenant, id, DeletionMarkFilename), &m)
	if !ok || err != nil {
		return nil, err
	}
	return &m, nil
}

// ReadNoCompactMark returns the block's no-compact mark, or nil without
// error when it has none.
func ReadNoCompactMark(ctx context.Context, bkt objstore.BucketReader, tenant string, id ulid.ULID) (*NoCompactMark, error) {
	var m NoCompactMark
	ok, err := readMark(ctx, bkt, ObjectName(tenant, id, NoCompactMarkFilename), &m)
	if !ok || err != nil {
		return nil, err
	}
	return &m, nil
}

func writeMark(ctx context.Context, bkt objstore.Bucket, name string, v any) error {
	b, err := json.MarshalIndent(v, "", "\t")
	if err != nil {
		return err
	}
	if err := bkt.Upload(ctx, name, bytes.NewReader(b)); err != nil {
		return fmt.Errorf("upload %s: %w", name, err)
	}
	return nil
}

func readMark(ctx context.Context, bkt objstore.BucketReader, name string, v any) (bool, error) {
	return readJSON(ctx, bkt, name, v, ErrBadMark)
}

// readJSON reads the object name into v: false without error when there is
// no such object, errBad wrapped into the error when it does not parse.
func readJSON(ctx context.Context, bkt objstore.BucketReader, name string, v any, errBad error) (bool, error) {
	rc, err := ExpectMissing(bkt).Get(ctx, name)
	if err != nil {
		if bkt.IsObjNotFoundErr(err) {
			return false, nil
		}
		return false, fmt.Errorf("get %s: %w", name, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		return false, fmt.Errorf("read %s: %w", name, err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("%w: parse %s: %w", errBad, name, err)
	}
	return true, nil
}
