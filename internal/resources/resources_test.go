package resources

import (
	"bufio"
	"math"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// The volumes' figures are df's: the same size, and free space within what
// other processes on the machine may write or delete between the two reads.
func TestVolumesMatchDF(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("compared with GNU df")
	}
	dir := t.TempDir()
	v := NewVolumes()
	v.Add(Volume{Name: "data", Dir: dir})
	v.Add(Volume{Name: "missing", Dir: dir + "/not-created-yet"})
	reg := prometheus.NewRegistry()
	reg.MustRegister(v)
	if n := testutil.CollectAndCount(v); n != 2 {
		t.Fatalf("%d metrics, want 2 (available and size of the data volume; nothing for a missing directory)", n)
	}
	out, err := exec.Command("df", "-B1", "--output=avail,size", dir).Output()
	if err != nil {
		t.Fatalf("df: %v", err)
	}
	fields := strings.Fields(strings.Split(strings.TrimSpace(string(out)), "\n")[1])
	dfAvail, _ := strconv.ParseFloat(fields[0], 64)
	dfSize, _ := strconv.ParseFloat(fields[1], 64)
	avail, size := gauge(t, reg, "gpustore_filesystem_available_bytes"), gauge(t, reg, "gpustore_filesystem_size_bytes")
	if size != dfSize {
		t.Errorf("size %g, df says %g", size, dfSize)
	}
	if math.Abs(avail-dfAvail) > 256<<20 || avail <= 0 || avail > size {
		t.Errorf("available %g, df says %g (size %g)", avail, dfAvail, size)
	}
}

// The memory limit is the cgroup's (v2 memory.max) when it sets one, else
// the machine's memory (MemTotal).
func TestMemoryLimit(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads /proc and /sys")
	}
	want := memTotal(t)
	if b, err := os.ReadFile("/sys/fs/cgroup/memory.max"); err == nil {
		if n, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64); err == nil {
			want = n
		}
	}
	if got := testutil.ToFloat64(MemoryLimit()); got != want {
		t.Errorf("gpustore_process_memory_limit_bytes = %g, want %g", got, want)
	}
}

func memTotal(t *testing.T) float64 {
	t.Helper()
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		if rest, ok := strings.CutPrefix(s.Text(), "MemTotal:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb * 1024
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no single %s", name)
	return 0
}
