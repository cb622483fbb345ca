//go:build linux || darwin

package resources

import "syscall"

// statfs returns the bytes available to an unprivileged user and the size
// of the filesystem holding dir.
func statfs(dir string) (avail, size uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		return 0, 0, err
	}
	bs := uint64(st.Bsize) //nolint:unconvert // int64 on Linux, uint32 on macOS
	return st.Bavail * bs, st.Blocks * bs, nil
}
