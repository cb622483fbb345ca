package ingest

import (
	"sync"

	"github.com/gpustore/gpustore/pkg/relabel"
	"github.com/prometheus/common/model"
)

// The dcgm preset drops DCGM_FI_DRIVER_VERSION from every metric, so that a
// driver upgrade changes one series per GPU instead of all of them; the
// version is kept as an info series per GPU,
//
//	dcgm_gpu_driver_info{UUID, <host label>, driver_version} 1
//
// (plus the HA cluster and replica labels when the series has them). No
// relabel rule can make a new series, so the ingester derives it: when a
// series of a tenant with the preset carries the driver label, a sample of
// the info series is appended with the same timestamp, at most once per GPU
// and timestamp (driverMemo). It goes through appendSeries like any series:
// the tenant's cache, rules, limits and HA dedup (only the elected replica
// writes it; a non-elected replica's series do not derive it at all). Its
// rejections are counted but never answered to the sender, who did not
// send it, and a 2.0 answer does not count it as written.

var (
	driverInfoName    = []byte(relabel.DriverInfoMetric)
	driverInfoVersion = []byte(relabel.DriverInfoVersion)
	uuidLabel         = []byte(relabel.UUIDLabel)
	hostLabelOld      = []byte(relabel.HostnameOld)
	hostLabelNew      = []byte(relabel.HostnameNew)
)

// driverMemo remembers per GPU (UUID) the driver version and the newest
// timestamp its info series was written for, so a scrape's 30-odd metrics
// of a GPU derive one info sample, not 30.
type driverMemo struct {
	mtx  sync.RWMutex
	gpus map[string]*gpuDriver
}

type gpuDriver struct {
	mtx    sync.Mutex
	driver string
	lastT  int64
}

func newDriverMemo() *driverMemo { return &driverMemo{gpus: map[string]*gpuDriver{}} }

// advance reports whether the info series of GPU uuid needs a sample at t
// (a newer timestamp, or another driver), and notes it.
func (m *driverMemo) advance(uuid, driver []byte, t int64) bool {
	m.mtx.RLock()
	g := m.gpus[yoloString(uuid)]
	m.mtx.RUnlock()
	if g == nil {
		m.mtx.Lock()
		if g = m.gpus[string(uuid)]; g == nil {
			g = &gpuDriver{lastT: t - 1}
			m.gpus[string(uuid)] = g
		}
		m.mtx.Unlock()
	}
	g.mtx.Lock()
	defer g.mtx.Unlock()
	if t <= g.lastT && g.driver == yoloString(driver) {
		return false
	}
	if g.driver != yoloString(driver) {
		g.driver = string(driver)
	}
	g.lastT = max(g.lastT, t)
	return true
}

// driverInfoLabels finds what the info series of a series' GPU needs; ok
// false: the series carries no driver version (or no UUID).
type driverInfoLabels struct {
	driver, uuid, host []byte
	cluster, replica   labelPair
}

func findDriverInfo(pairs []labelPair, clusterLabel, replicaLabel string) (d driverInfoLabels, ok bool) {
	for _, p := range pairs {
		switch yoloString(p.name) {
		case relabel.DriverVersionLabel, relabel.DriverVersionLabel49:
			d.driver = p.value
		case relabel.UUIDLabel:
			d.uuid = p.value
		case relabel.HostnameOld, relabel.HostnameNew:
			if len(p.value) > 0 {
				d.host = p.value
			}
		case clusterLabel:
			d.cluster = p
		case replicaLabel:
			d.replica = p
		}
	}
	return d, len(d.driver) > 0 && len(d.uuid) > 0
}

// appendDriverInfo derives the driver info series of s's GPU (see above).
func (w *writeRequest) appendDriverInfo(s *decodedSeries) error {
	if len(s.samples) == 0 {
		return nil
	}
	d, ok := findDriverInfo(s.labels, w.lim.HAClusterLabel, w.lim.HAReplicaLabel)
	if !ok {
		return nil
	}
	if w.ha != nil && len(d.cluster.value) > 0 && len(d.replica.value) > 0 {
		di, err := w.decide(d.cluster.value, d.replica.value)
		if err != nil {
			return err
		}
		if dec := &w.decisions[di]; !dec.elected && !dec.fill {
			return nil
		}
	}
	info := &w.ac.info
	info.reset()
	for _, smp := range s.samples {
		if smp.t <= w.maxT && w.tenant.drivers.advance(d.uuid, d.driver, smp.t) {
			info.samples = append(info.samples, sample{t: smp.t, v: 1})
		}
	}
	if len(info.samples) == 0 {
		return nil
	}
	host := hostLabelOld
	if w.dcgmHost == relabel.HostnameNew {
		host = hostLabelNew
	}
	// A fixed order: the cache key hashes the pairs as they come.
	info.labels = append(info.labels, labelPair{nameLabel, driverInfoName}, labelPair{uuidLabel, d.uuid}, labelPair{host, d.host}, labelPair{driverInfoVersion, d.driver})
	if len(d.cluster.value) > 0 {
		info.labels = append(info.labels, d.cluster)
	}
	if len(d.replica.value) > 0 {
		info.labels = append(info.labels, d.replica)
	}
	st := &w.stats
	before := st.samples + st.deduplicated + st.relabelDropped
	st.derived = true
	err := w.appendSeries(info)
	st.derived = false
	st.derivedAcked += st.samples + st.deduplicated + st.relabelDropped - before
	return err
}

// dcgmUnitScale returns how to bring a series' samples to the unit the
// dcgm preset stores its metric in, value * mul / div (dcgm-exporter 4.9
// sends clocks in Hz, energy in J, utilisation as a ratio, memory in bytes;
// the preset renames those metrics to their earlier names, whose units were
// MHz, mJ, percent and MiB), or div 0 for a series whose value is kept. Only
// a tenant with the preset calls it: one scan of the wire labels for the
// name.
func dcgmUnitScale(pairs []labelPair) (mul, div float64) {
	for _, p := range pairs {
		if yoloString(p.name) == model.MetricNameLabel {
			if mul, div, ok := relabel.DCGMUnitScale(yoloString(p.value)); ok {
				return mul, div
			}
			return 0, 0
		}
	}
	return 0, 0
}
