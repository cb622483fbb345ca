package load

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ProcSample is one reading of a process from /proc.
type ProcSample struct {
	At time.Time
	// CPUTicks is utime+stime from /proc/<pid>/stat, in clock ticks
	// (ClockTicks per second). Children are not counted: the receivers run
	// in one process.
	CPUTicks uint64
	// RSS and HWM are VmRSS and VmHWM (peak resident set) from
	// /proc/<pid>/status, in bytes.
	RSS, HWM int64
}

var (
	clkOnce sync.Once
	clkTck  = 100
)

// ClockTicks returns the kernel's clock ticks per second (getconf CLK_TCK),
// which /proc/<pid>/stat counts CPU time in. 100 on every Linux this runs on;
// asked once, with 100 as the fallback.
func ClockTicks() int {
	clkOnce.Do(func() {
		out, err := exec.Command("getconf", "CLK_TCK").Output()
		if err != nil {
			return
		}
		if n, err := strconv.Atoi(strings.TrimSpace(string(out))); err == nil && n > 0 {
			clkTck = n
		}
	})
	return clkTck
}

// CPUSeconds converts clock ticks to seconds.
func CPUSeconds(ticks uint64) float64 { return float64(ticks) / float64(ClockTicks()) }

// ReadProc reads the CPU time and memory of process pid.
func ReadProc(pid int) (ProcSample, error) {
	s := ProcSample{At: time.Now()}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, fmt.Errorf("read stat of pid %d: %w", pid, err)
	}
	ut, st, err := ParseStat(stat)
	if err != nil {
		return s, fmt.Errorf("pid %d: %w", pid, err)
	}
	s.CPUTicks = ut + st
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, fmt.Errorf("read status of pid %d: %w", pid, err)
	}
	if s.RSS, s.HWM, err = ParseStatus(status); err != nil {
		return s, fmt.Errorf("pid %d: %w", pid, err)
	}
	return s, nil
}

// ParseStat returns utime and stime (fields 14 and 15, clock ticks) of a
// /proc/<pid>/stat line. The command name (field 2) is in parentheses and may
// itself contain spaces and parentheses, so fields are counted from the last
// ')'.
func ParseStat(b []byte) (utime, stime uint64, err error) {
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("stat: no ')' after the command name")
	}
	// After ") " come field 3 (state), 4 (ppid), ... so utime (14) is the
	// 12th field of the rest and stime (15) the 13th.
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 13 {
		return 0, 0, fmt.Errorf("stat: %d fields after the command name, want at least 13", len(f))
	}
	if utime, err = strconv.ParseUint(f[11], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("stat utime: %w", err)
	}
	if stime, err = strconv.ParseUint(f[12], 10, 64); err != nil {
		return 0, 0, fmt.Errorf("stat stime: %w", err)
	}
	return utime, stime, nil
}

// ParseStatus returns VmRSS and VmHWM in bytes from /proc/<pid>/status
// (the kernel prints them in kB, meaning KiB).
func ParseStatus(b []byte) (rss, hwm int64, err error) {
	var haveRSS, haveHWM bool
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		line := sc.Text()
		var dst *int64
		switch {
		case strings.HasPrefix(line, "VmRSS:"):
			dst, haveRSS = &rss, true
		case strings.HasPrefix(line, "VmHWM:"):
			dst, haveHWM = &hwm, true
		default:
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 || f[2] != "kB" {
			return 0, 0, fmt.Errorf("status: malformed line %q", line)
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("status: %q: %w", line, err)
		}
		*dst = v * 1024
	}
	if !haveRSS || !haveHWM {
		return 0, 0, errors.New("status: VmRSS or VmHWM missing (process exited?)")
	}
	return rss, hwm, nil
}

// WaitIdle polls pid until its CPU use stays under maxCores (e.g. 0.05) for
// quiet consecutive seconds, or until timeout. It returns how long it waited
// and whether the process became idle. Used after a write phase so that work
// a receiver defers (flushes, merges, compaction) is counted in its CPU time
// and does not run under the query benchmark.
func WaitIdle(ctx context.Context, pid int, maxCores float64, quiet, timeout time.Duration) (time.Duration, bool, error) {
	start := time.Now()
	prev, err := ReadProc(pid)
	if err != nil {
		return 0, false, err
	}
	var calm time.Duration
	const tick = 500 * time.Millisecond
	for time.Since(start) < timeout {
		select {
		case <-ctx.Done():
			return time.Since(start), false, ctx.Err()
		case <-time.After(tick):
		}
		cur, err := ReadProc(pid)
		if err != nil {
			return time.Since(start), false, err
		}
		cores := CPUSeconds(cur.CPUTicks-prev.CPUTicks) / cur.At.Sub(prev.At).Seconds()
		prev = cur
		if cores < maxCores {
			calm += tick
			if calm >= quiet {
				return time.Since(start), true, nil
			}
		} else {
			calm = 0
		}
	}
	return time.Since(start), false, nil
}

// DiskUsage is what a data directory holds.
type DiskUsage struct {
	// Bytes is the space allocated on disk (st_blocks × 512, what `du` counts);
	// Apparent is the sum of file sizes.
	Bytes, Apparent int64
	Files           int
	// Bucket is the part of Bytes under BucketDirName: gpustore's embedded
	// object-store bucket, where the shipper copies every finished block.
	// Those are second copies of local blocks (until local retention deletes
	// them), so they are reported apart from the local TSDB, not in it.
	Bucket int64
	// Parts is Bytes per top-level entry class: for Prometheus TSDBs "wal",
	// "chunks_head", "blocks" (ULID directories) and "other"; gpustore's
	// "bucket"; other layouts (VictoriaMetrics' data/ and indexdb/) by
	// top-level directory name.
	Parts map[string]int64
}

// BucketDirName is the directory of gpustore's embedded FILESYSTEM bucket
// inside its data directory (pkg/storage/bucket.DefaultDirName).
const BucketDirName = "bucket"

// Local is what the receiver's own storage (WAL, head chunks, local blocks)
// takes: Bytes without the bucket.
func (u DiskUsage) Local() int64 { return u.Bytes - u.Bucket }

// DirUsage walks dir and sums what it holds, like `du -s --bytes` for
// Apparent and `du -s` for Bytes. Hard links are counted once.
func DirUsage(dir string) (DiskUsage, error) {
	u := DiskUsage{Parts: map[string]int64{}}
	seen := map[[2]uint64]bool{}
	resolutions := map[string]string{} // bucket block directory → part name
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) { // a file removed under us (compaction)
				return nil
			}
			return err
		}
		info, err := d.Info()
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return fmt.Errorf("%s: no stat_t", path)
		}
		key := [2]uint64{uint64(st.Dev), uint64(st.Ino)}
		if seen[key] {
			return nil
		}
		seen[key] = true
		alloc := st.Blocks * 512
		u.Bytes += alloc
		if info.Mode().IsRegular() {
			u.Apparent += info.Size()
			u.Files++
		}
		rel, _ := filepath.Rel(dir, path)
		if rel != "." {
			part := partOf(rel)
			if part == BucketDirName {
				part = bucketPart(dir, rel, resolutions)
			}
			u.Parts[part] += alloc
			if strings.HasPrefix(part, BucketDirName) {
				u.Bucket += alloc
			}
		}
		return nil
	})
	if err != nil {
		return u, fmt.Errorf("disk usage of %s: %w", dir, err)
	}
	return u, nil
}

// bucketPart names the part of a file in gpustore's bucket: "bucket" for raw
// blocks and everything else, "bucket 5m" and "bucket 1h" for downsampled
// blocks (their meta.json's gpustore.downsample.resolution). The field is
// read here rather than through pkg/block, which would link the TSDB into
// the load driver that also drives the other systems.
func bucketPart(dir, rel string, cache map[string]string) string {
	parts := strings.Split(filepath.ToSlash(rel), "/")
	if len(parts) < 4 { // bucket/<tenant>/<ULID>/<file>
		return BucketDirName
	}
	blockDir := filepath.Join(dir, parts[0], parts[1], parts[2])
	if p, ok := cache[blockDir]; ok {
		return p
	}
	p := BucketDirName
	if raw, err := os.ReadFile(filepath.Join(blockDir, "meta.json")); err == nil {
		var m struct {
			GPUStore struct {
				Downsample struct {
					Resolution int64 `json:"resolution"`
				} `json:"downsample"`
			} `json:"gpustore"`
		}
		if json.Unmarshal(raw, &m) == nil {
			switch m.GPUStore.Downsample.Resolution {
			case 5 * 60 * 1000:
				p = BucketDirName + " 5m"
			case 60 * 60 * 1000:
				p = BucketDirName + " 1h"
			}
		}
	}
	cache[blockDir] = p
	return p
}

// partOf classifies a path relative to a data directory. gpustore's bucket
// comes first: its <tenant>/<ULID>/ directories are uploaded copies, not
// local blocks. Prometheus-style TSDB directories (also gpustore's
// tenants/<t>/) are recognised at any depth.
func partOf(rel string) string {
	parts := strings.Split(filepath.ToSlash(rel), "/")
	if parts[0] == BucketDirName {
		return BucketDirName
	}
	for _, p := range parts {
		switch {
		case p == "wal" || p == "wbl":
			return "wal"
		case p == "chunks_head":
			return "chunks_head"
		case isULID(p):
			return "blocks"
		}
	}
	if len(parts) > 1 {
		if parts[0] == "tenants" {
			return "other"
		}
		return parts[0]
	}
	return "other"
}

func isULID(s string) bool {
	if len(s) != 26 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}

// String renders the usage with its parts, largest first.
func (u DiskUsage) String() string {
	keys := make([]string, 0, len(u.Parts))
	for k := range u.Parts {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool { return u.Parts[keys[i]] > u.Parts[keys[j]] })
	var b strings.Builder
	fmt.Fprintf(&b, "%s allocated (%s apparent, %d files)", fmtBytes(u.Bytes), fmtBytes(u.Apparent), u.Files)
	if u.Bucket > 0 {
		fmt.Fprintf(&b, ", of which local %s and bucket %s", fmtBytes(u.Local()), fmtBytes(u.Bucket))
	}
	for i, k := range keys {
		if i == 0 {
			b.WriteString(": ")
		} else {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "%s %s", k, fmtBytes(u.Parts[k]))
	}
	return b.String()
}

func fmtBytes(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// StopProcess sends SIGTERM to pid (a process this program need not have
// started) and waits up to timeout for it to exit, so that what it wrote on
// shutdown is on disk before the data directory is measured.
func StopProcess(ctx context.Context, pid int, timeout time.Duration) error {
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return fmt.Errorf("stop pid %d: %w", pid, err)
	}
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if !alive(pid) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	return fmt.Errorf("pid %d still running %s after SIGTERM", pid, timeout)
}

// alive reports whether pid exists and is not a zombie.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}
