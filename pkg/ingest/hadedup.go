package ingest

import (
	"errors"
	"sync"
)

// HA dedup per series. The tracker (pkg/hatracker) says per request whether
// a replica of a Prometheus HA pair is elected, or may fill a gap while the
// elected one is silent. Per series the cache entry then decides each
// sample: samples of two replicas are never stored closer than the gap-fill
// delay, and a sample another replica already covered is acknowledged and
// dropped.
//
// The state a request decides against is what was committed: a request's
// claims on its series are visible to other requests while it runs (so two
// replicas cannot both pass the rule for one series), but they only become
// the series' newest sample after the TSDB commit succeeded. A request that
// fails (rate limit, storage or election-store fault) gives its claims back,
// and leaves the series as if it had never come.

// errHAConflict fails a request that would store a sample of a series for
// which a concurrent request of another replica holds a claim: whether this
// sample may be stored depends on whether that request commits. The sender
// retries (503); by then the other request has committed or given up. It
// happens only while a replica fills a gap and the other one comes back.
var errHAConflict = errors.New("a concurrent write of the other replica of the HA pair holds the same series")

// haState is one series' dedup state, in its cache entry.
type haState struct {
	mtx sync.Mutex
	// The newest committed sample and the HA pair (haTable index) of the
	// replica that sent it; lastPair 0: none yet.
	lastT    int64
	lastPair uint32
	// Claims of requests that have not committed or rolled back yet, all of
	// one pair: a claim of another pair is a conflict.
	inflight     uint32
	inflightPair uint32
}

// haClaim is one request's claim on one series.
type haClaim struct {
	st       *haState
	decision int // index in writeRequest.decisions
	pair     uint32
	elected  bool
	// registered: counted in st.inflight; the claim must be committed or released.
	registered bool
	// The state this request decides against: the committed state when the
	// claim was registered, advanced by the request's own admitted samples.
	lastT    int64
	lastPair uint32
	// The newest sample of this claim the appender took.
	stored  bool
	storedT int64
}

// admits is the rule: may a sample at t of this claim's replica be stored,
// given the series' newest sample (lastT from lastPair)?
//   - the first sample of a series, yes;
//   - the elected replica continuing its own samples, yes (an older one is
//     for the TSDB to judge: out of order, or inside the out-of-order window);
//   - a filling replica continuing its own fill, if not older;
//   - otherwise (the other replica wrote last), only at least gap later.
func (c *haClaim) admits(lastT int64, lastPair uint32, t, gap int64) bool {
	switch lastPair {
	case 0:
		return true
	case c.pair:
		return c.elected || t >= lastT
	}
	return t >= lastT+gap
}

// admit decides a sample at t. The first admitted sample registers the claim
// on the series under its lock; later samples of the series in the same
// request decide against the claim's view, which no other replica can
// change while the claim is registered.
func (c *haClaim) admit(t, gap int64) (bool, error) {
	if c.registered {
		if !c.admits(c.lastT, c.lastPair, t, gap) {
			return false, nil
		}
		c.advance(t)
		return true, nil
	}
	h := c.st
	h.mtx.Lock()
	if !c.admits(h.lastT, h.lastPair, t, gap) {
		// Dropping is safe against the committed state alone: what covers
		// this sample is stored.
		h.mtx.Unlock()
		return false, nil
	}
	if h.inflight > 0 && h.inflightPair != c.pair {
		h.mtx.Unlock()
		return false, errHAConflict
	}
	h.inflight++
	h.inflightPair = c.pair
	c.lastT, c.lastPair = h.lastT, h.lastPair
	h.mtx.Unlock()
	c.registered = true
	c.advance(t)
	return true, nil
}

func (c *haClaim) advance(t int64) {
	if c.lastPair != c.pair || t > c.lastT {
		c.lastT, c.lastPair = t, c.pair
	}
}

// appended notes that the appender took the claim's sample at t.
func (c *haClaim) appended(t int64) {
	if !c.stored || t > c.storedT {
		c.stored, c.storedT = true, t
	}
}

// commit records the claim's newest stored sample as the series' newest,
// after the TSDB commit succeeded.
func (c *haClaim) commit() {
	if !c.registered {
		return
	}
	h := c.st
	h.mtx.Lock()
	if c.stored && (c.storedT > h.lastT || h.lastPair == 0) {
		h.lastT, h.lastPair = c.storedT, c.pair
	}
	h.inflight--
	h.mtx.Unlock()
}

// release gives the claim back: the request stored nothing.
func (c *haClaim) release() {
	if !c.registered {
		return
	}
	h := c.st
	h.mtx.Lock()
	h.inflight--
	h.mtx.Unlock()
}

// haDecision is the tracker's answer for one (cluster, replica) of a request.
type haDecision struct {
	pair             uint32 // index in the tenant's haTable
	cluster, replica string
	elected          bool
	// fill: the elected replica has been silent for the gap-fill delay, so
	// this replica's samples may fill the gap until the failover.
	fill    bool
	dropped int // samples dropped as duplicates
}

// decide asks the tracker, once per request and HA pair, whether the pair's
// replica is the elected one, and returns the index of the answer in
// w.decisions.
func (w *writeRequest) decide(cluster, replica []byte) (int, error) {
	// The memo is searched by the wire bytes: a request nearly always has a
	// single pair, so this is one short comparison per series instead of an
	// intern-table lookup (a lock and a string hash).
	for i := range w.decisions {
		d := &w.decisions[i]
		if string(replica) == d.replica && string(cluster) == d.cluster {
			return i, nil
		}
	}
	idx := w.tenant.ha.index(cluster, replica)
	p := w.tenant.ha.pair(idx)
	elected, err := w.ha.Accept(w.ctx, w.tenant.id, p.cluster, p.replica)
	if err != nil {
		return 0, err
	}
	d := haDecision{pair: idx, cluster: p.cluster, replica: p.replica, elected: elected}
	if !elected && w.gap > 0 && w.ha.Silence(w.tenant.id, p.cluster).Milliseconds() >= w.gap {
		d.fill = true
	}
	w.decisions = append(w.decisions, d)
	return len(w.decisions) - 1, nil
}

// haLabels returns the cluster and replica label values of an HA pair's
// series, or nils for any other series. It is the rule seriesKey.compute
// applies while it hashes.
func haLabels(pairs []labelPair, clusterLabel, replicaLabel string) (cluster, replica []byte) {
	for _, p := range pairs {
		switch {
		case len(p.name) == len(clusterLabel) && yoloString(p.name) == clusterLabel:
			cluster = p.value
		case replica == nil && len(p.name) == len(replicaLabel) && yoloString(p.name) == replicaLabel:
			replica = p.value
		}
	}
	if len(cluster) == 0 || len(replica) == 0 {
		return nil, nil
	}
	return cluster, replica
}

// haTable interns the (cluster, replica) pairs of a tenant's series as small
// indexes, so the dedup state per series stays small.
type haTable struct {
	mtx   sync.RWMutex
	idx   map[haPair]uint32
	pairs []haPair // pairs[0] is "no pair"
}

type haPair struct{ cluster, replica string }

func newHATable() *haTable {
	return &haTable{idx: map[haPair]uint32{}, pairs: []haPair{{}}}
}

func (t *haTable) index(cluster, replica []byte) uint32 {
	t.mtx.RLock()
	i, ok := t.idx[haPair{yoloString(cluster), yoloString(replica)}]
	t.mtx.RUnlock()
	if ok {
		return i
	}
	p := haPair{string(cluster), string(replica)}
	t.mtx.Lock()
	defer t.mtx.Unlock()
	if i, ok := t.idx[p]; ok {
		return i
	}
	i = uint32(len(t.pairs))
	t.pairs = append(t.pairs, p)
	t.idx[p] = i
	return i
}

func (t *haTable) pair(i uint32) haPair {
	t.mtx.RLock()
	defer t.mtx.RUnlock()
	return t.pairs[i]
}
