package bucket

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/thanos-io/objstore"
	"github.com/thanos-io/objstore/providers/filesystem"
)

// tmpDirName is the directory, at the folder bucket's root, where uploads
// are written before they are renamed into place. It is not a valid tenant
// ID ('~'), so no tenant listing can take it for one, and Iter hides it.
const tmpDirName = "~tmp"

// staleTmpAge: a temporary file untouched this long at open is what a
// crashed upload left (a running upload writes to its file all the time).
const staleTmpAge = time.Hour

// durableFolder is objstore's filesystem bucket with an Upload that a crash
// or a power cut cannot leave half done: the object is written to a
// temporary file, fsynced, renamed over the object's name, and the
// directory is fsynced (as pkg/storage/shipper writes shipper.json). objstore's own
// Upload truncates the object in place and writes into it, so a reader
// could see a torn meta.json, deletion mark or bucket index, and after a
// power cut an empty one. Readers now see the previous object or the new
// one, whole; the data of every object the bucket acknowledged is on disk.
type durableFolder struct {
	*filesystem.Bucket
	root string
}

func newDurableFolder(dir string) (*durableFolder, error) {
	root, err := filepath.Abs(dir)
	if err != nil {
		return nil, err
	}
	b, err := filesystem.NewBucket(root)
	if err != nil {
		return nil, err
	}
	d := &durableFolder{Bucket: b, root: root}
	if err := os.MkdirAll(d.tmpDir(), 0o755); err != nil {
		return nil, fmt.Errorf("create %s: %w", d.tmpDir(), err)
	}
	d.removeStaleTmp(time.Now().Add(-staleTmpAge))
	return d, nil
}

func (d *durableFolder) tmpDir() string { return filepath.Join(d.root, tmpDirName) }

// removeStaleTmp removes temporary files older than before: what uploads
// cut short by a crash left behind. Younger ones may be another process's
// uploads in progress (roles sharing the folder).
func (d *durableFolder) removeStaleTmp(before time.Time) {
	entries, _ := os.ReadDir(d.tmpDir())
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.ModTime().Before(before) {
			_ = os.Remove(filepath.Join(d.tmpDir(), e.Name()))
		}
	}
}

// Upload writes r to the object name durably and atomically.
func (d *durableFolder) Upload(ctx context.Context, name string, r io.Reader, _ ...objstore.ObjectUploadOption) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	f, err := os.CreateTemp(d.tmpDir(), "upload-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	done := false
	defer func() {
		if !done {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}()
	if _, err := io.Copy(f, r); err != nil {
		return fmt.Errorf("write %s: %w", name, err)
	}
	if err := f.Chmod(0o644); err != nil { // CreateTemp's 0600 would hide it from other users
		return err
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", name, err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := d.place(name, func(dst string) error { return os.Rename(tmp, dst) }); err != nil {
		return err
	}
	done = true
	return nil
}

// place puts a file at the object name with put (a rename or a link),
// creating its directories durably first, and fsyncs the directory it is
// in. A concurrent Delete of the directory's last object removes empty
// directories: then the directory is created again.
func (d *durableFolder) place(name string, put func(dst string) error) error {
	dst := filepath.Join(d.root, filepath.FromSlash(name))
	var err error
	for range 3 {
		if err = mkdirAllSynced(d.root, filepath.Dir(dst)); err != nil {
			return err
		}
		if err = put(dst); !errors.Is(err, fs.ErrNotExist) {
			break
		}
	}
	if err != nil {
		return err
	}
	return syncDir(filepath.Dir(dst))
}

// link makes the object name the file src (block.Linker), durably.
func (d *durableFolder) link(src, name string) error {
	return d.place(name, func(dst string) error {
		if err := os.Remove(dst); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		return os.Link(src, dst)
	})
}

// Iter hides the temporary directory from listings of the root.
func (d *durableFolder) Iter(ctx context.Context, dir string, f func(string) error, opts ...objstore.IterOption) error {
	return d.Bucket.Iter(ctx, dir, func(name string) error {
		if isTmp(dir, name) {
			return nil
		}
		return f(name)
	}, opts...)
}

// IterWithAttributes hides the temporary directory like Iter.
func (d *durableFolder) IterWithAttributes(ctx context.Context, dir string, f func(objstore.IterObjectAttributes) error, opts ...objstore.IterOption) error {
	return d.Bucket.IterWithAttributes(ctx, dir, func(a objstore.IterObjectAttributes) error {
		if isTmp(dir, a.Name) {
			return nil
		}
		return f(a)
	}, opts...)
}

func isTmp(dir, name string) bool {
	return strings.Trim(dir, "/") == "" && strings.HasPrefix(name, tmpDirName+"/")
}

// mkdirAllSynced creates dir and its missing parents under root, fsyncing
// each new directory's parent so that the new entries survive a power cut.
func mkdirAllSynced(root, dir string) error {
	if _, err := os.Stat(dir); err == nil {
		return nil
	}
	var missing []string
	for p := dir; p != root && len(p) > len(root); p = filepath.Dir(p) {
		if _, err := os.Stat(p); err == nil {
			break
		}
		missing = append(missing, p)
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		if err := syncDir(filepath.Dir(missing[i])); err != nil {
			return err
		}
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
