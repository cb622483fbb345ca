// Package resources exports what the self-alerts need about the machine a
// gpustore process runs on and client_golang's process collector does not
// say: how much memory the process may use, and how full the volumes it
// writes to are.
package resources

import (
	"sync"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/prometheus/client_golang/prometheus"
)

// MemoryLimit returns a collector of gpustore_process_memory_limit_bytes:
// the container's (cgroup) memory limit, else the machine's memory, read at
// every scrape (a limit can be resized in place). Beside
// process_resident_memory_bytes it says how close the process is to the
// OOM killer.
func MemoryLimit() prometheus.Collector {
	limit := memlimit.ApplyFallback(memlimit.FromCgroup, memlimit.FromSystem)
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "gpustore_process_memory_limit_bytes",
		Help: "Memory the process may use: its container's (cgroup) limit, else the machine's memory.",
	}, func() float64 {
		l, err := limit()
		if err != nil {
			return 0
		}
		return float64(l)
	})
}

// Volume is a directory gpustore writes to, named for the metrics' volume
// label.
type Volume struct {
	Name, Dir string
}

// Volumes collects the free and total bytes of the filesystems holding
// each volume's directory, read at every scrape. A directory that cannot be
// read (not created yet) reports nothing.
type Volumes struct {
	mtx         sync.Mutex
	vols        []Volume
	avail, size *prometheus.Desc
}

// NewVolumes returns a collector of no volume yet: the roles that write to
// one add it as they start (Add).
func NewVolumes() *Volumes {
	return &Volumes{
		avail: prometheus.NewDesc("gpustore_filesystem_available_bytes",
			"Bytes available to gpustore on the filesystem holding a volume's directory (data: the TSDBs and WAL; compact: the compactor's scratch).", []string{"volume"}, nil),
		size: prometheus.NewDesc("gpustore_filesystem_size_bytes",
			"Size of the filesystem holding a volume's directory.", []string{"volume"}, nil),
	}
}

// Add reports vol from the next scrape on.
func (v *Volumes) Add(vol Volume) {
	v.mtx.Lock()
	defer v.mtx.Unlock()
	v.vols = append(v.vols, vol)
}

// Describe implements prometheus.Collector.
func (v *Volumes) Describe(ch chan<- *prometheus.Desc) {
	ch <- v.avail
	ch <- v.size
}

// Collect implements prometheus.Collector.
func (v *Volumes) Collect(ch chan<- prometheus.Metric) {
	v.mtx.Lock()
	vols := v.vols
	v.mtx.Unlock()
	for _, vol := range vols {
		avail, size, err := statfs(vol.Dir)
		if err != nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(v.avail, prometheus.GaugeValue, float64(avail), vol.Name)
		ch <- prometheus.MustNewConstMetric(v.size, prometheus.GaugeValue, float64(size), vol.Name)
	}
}
