package load

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpustore/gpustore/pkg/storage/bucket"
)

func TestParseStat(t *testing.T) {
	// The command name may hold spaces and parentheses; fields are counted
	// from the last ')'. utime=1234, stime=567 (fields 14 and 15).
	line := "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 1000 0 0 0 1234 567 0 0 20 0 12 0 99 123456 789 18446744073709551615\n"
	ut, st, err := ParseStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if ut != 1234 || st != 567 {
		t.Fatalf("utime, stime = %d, %d; want 1234, 567", ut, st)
	}
	for _, bad := range []string{"", "12 noparen S 1", "1 (x) S 1 2 3"} {
		if _, _, err := ParseStat([]byte(bad)); err == nil {
			t.Errorf("ParseStat(%q): want an error", bad)
		}
	}
}

func TestParseStatus(t *testing.T) {
	status := "Name:\tprometheus\nVmPeak:\t 2000000 kB\nVmHWM:\t  301234 kB\nVmRSS:\t  250000 kB\nThreads:\t12\n"
	rss, hwm, err := ParseStatus([]byte(status))
	if err != nil {
		t.Fatal(err)
	}
	if rss != 250000*1024 || hwm != 301234*1024 {
		t.Fatalf("rss, hwm = %d, %d", rss, hwm)
	}
	if _, _, err := ParseStatus([]byte("Name:\tx\nVmRSS:\t1 kB\n")); err == nil {
		t.Error("missing VmHWM: want an error")
	}
	if _, _, err := ParseStatus([]byte("VmRSS:\t1 MB\nVmHWM:\t1 kB\n")); err == nil {
		t.Error("unknown unit: want an error")
	}
}

func TestReadProcSelf(t *testing.T) {
	// Burn a little CPU so the tick counter has something to show.
	deadline := time.Now().Add(50 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	p, err := ReadProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.HWM <= 0 || p.RSS <= 0 || p.HWM < p.RSS/2 {
		t.Fatalf("implausible memory: %+v", p)
	}
	if ClockTicks() <= 0 {
		t.Fatalf("ClockTicks = %d", ClockTicks())
	}
	if CPUSeconds(uint64(ClockTicks())) != 1 {
		t.Fatalf("CPUSeconds(CLK_TCK) = %v", CPUSeconds(uint64(ClockTicks())))
	}
}

func TestDirUsage(t *testing.T) {
	dir := t.TempDir()
	write := func(rel string, n int) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("tenants/default/wal/00000000", 10000)
	write("tenants/default/chunks_head/000001", 5000)
	write("tenants/default/01JABCDEFGHJKMNPQRSTVWXYZ0/chunks/000001", 20000)
	write("tenants/default/01JABCDEFGHJKMNPQRSTVWXYZ0/index", 3000)
	write("data/small/part", 7000) // VictoriaMetrics-style
	write("lock", 0)
	u, err := DirUsage(dir)
	if err != nil {
		t.Fatal(err)
	}
	if u.Apparent != 45000 || u.Files != 6 {
		t.Fatalf("apparent %d in %d files; want 45000 in 6", u.Apparent, u.Files)
	}
	if u.Bytes < u.Apparent {
		t.Fatalf("allocated %d < apparent %d", u.Bytes, u.Apparent)
	}
	for _, part := range []string{"wal", "chunks_head", "blocks", "data"} {
		if u.Parts[part] == 0 {
			t.Errorf("part %s: nothing counted (%v)", part, u.Parts)
		}
	}
	if u.Parts["blocks"] < 23000 {
		t.Errorf("blocks %d: want ≥ 23000", u.Parts["blocks"])
	}
	if s := u.String(); s == "" {
		t.Error("empty String")
	}
}

// gpustore's embedded bucket (<data>/bucket) holds a copy of every shipped
// block under <tenant>/<ULID>/. Those bytes are the bucket's, not local
// blocks: counting them as "blocks" counted each shipped block twice.
func TestDirUsageSeparatesTheBucket(t *testing.T) {
	if BucketDirName != bucket.DefaultDirName {
		t.Fatalf("BucketDirName %q, gpustore's bucket directory is %q", BucketDirName, bucket.DefaultDirName)
	}
	dir := t.TempDir()
	write := func(rel string, n int) {
		p := filepath.Join(dir, rel)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, bytes.Repeat([]byte{0x5a}, n), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const (
		kib    = 1024
		chunks = 200 * kib
		index  = 50 * kib
		meta   = 1 * kib
		wal    = 100 * kib
		slack  = 64 * kib // rounding of files to whole disk blocks, and directories
	)
	for _, id := range []string{"01JABCDEFGHJKMNPQRSTVWXYZ0", "01JABCDEFGHJKMNPQRSTVWXYZ1"} {
		write("tenants/default/"+id+"/chunks/000001", chunks)
		write("tenants/default/"+id+"/index", index)
		write("tenants/default/"+id+"/meta.json", meta)
		write("bucket/default/"+id+"/chunks/000001", chunks) // the shipper's copy
		write("bucket/default/"+id+"/index", index)
		write("bucket/default/"+id+"/meta.json", meta)
	}
	write("tenants/default/wal/00000000", wal)
	u, err := DirUsage(dir)
	if err != nil {
		t.Fatal(err)
	}
	const blocks = 2 * (chunks + index + meta)
	between := func(what string, got, lo int64) {
		t.Helper()
		if got < lo || got >= lo+slack {
			t.Errorf("%s = %d bytes; want %d (+ less than %d of rounding)", what, got, lo, slack)
		}
	}
	between("local blocks", u.Parts["blocks"], blocks)
	between("bucket", u.Bucket, blocks)
	between("bucket part", u.Parts["bucket"], blocks)
	between("local", u.Local(), blocks+wal)
	if u.Local()+u.Bucket != u.Bytes {
		t.Errorf("local %d + bucket %d != total %d", u.Local(), u.Bucket, u.Bytes)
	}
	if s := u.String(); !strings.Contains(s, "bucket ") || !strings.Contains(s, "of which local ") {
		t.Errorf("String() does not show the bucket apart: %s", s)
	}
}

func TestPartOf(t *testing.T) {
	for rel, want := range map[string]string{
		"wal/00000001": "wal",
		"tenants/t1/wal/checkpoint.0001/00000000":         "wal",
		"chunks_head/000002":                              "chunks_head",
		"01JABCDEFGHJKMNPQRSTVWXYZ0/index":                "blocks",
		"tenants/t1/01JABCDEFGHJKMNPQRSTVWXYZ0/meta.json": "blocks",
		"indexdb/123/part":                                "indexdb",
		"lock":                                            "other",
		"tenants/t1/metadata.json":                        "other",
		"bucket/t1/01JABCDEFGHJKMNPQRSTVWXYZ0/index":      "bucket",
		"bucket/t1/01JABCDEFGHJKMNPQRSTVWXYZ0/chunks/1":   "bucket",
	} {
		if got := partOf(rel); got != want {
			t.Errorf("partOf(%q) = %q; want %q", rel, got, want)
		}
	}
}

func TestStopProcessAndWaitIdle(t *testing.T) {
	cmd := exec.Command("sleep", "30")
	if err := cmd.Start(); err != nil {
		t.Fatalf("start sleep (coreutils): %v", err)
	}
	defer func() { _ = cmd.Process.Kill() }() // already exited when the test passes
	waited, idle, err := WaitIdle(context.Background(), cmd.Process.Pid, 0.5, time.Second, 10*time.Second)
	if err != nil || !idle {
		t.Fatalf("WaitIdle(sleep) = %v, %v, %v; want idle", waited, idle, err)
	}
	if err := StopProcess(context.Background(), cmd.Process.Pid, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if alive(cmd.Process.Pid) {
		t.Fatal("still alive after StopProcess")
	}
}
