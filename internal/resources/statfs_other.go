//go:build !linux && !darwin

package resources

import "errors"

func statfs(string) (uint64, uint64, error) {
	return 0, 0, errors.New("filesystem statistics are read on Linux and macOS only")
}
