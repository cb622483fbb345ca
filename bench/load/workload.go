// Package load drives gpustore (or any Prometheus remote-write receiver) with
// the gpusim GPU-cluster workload and measures it: accepted samples/s,
// request latency, answers by HTTP code, the receiver's CPU time and peak RSS
// from /proc, on-disk bytes per sample, and the latency of the source
// document's Grafana dashboard queries. bench/cmd/loadgen and
// bench/cmd/benchcompare are its commands.
package load

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"slices"
	"sync"
	"time"

	"github.com/gpustore/gpustore/bench/gpusim"
)

// Workload is a stretch of simulated history to write: Ticks scrapes of the
// cluster, Interval apart, from Start, by one replica. Equal Workloads give
// byte-identical requests (the simulator is a pure function of seed and
// time), which is how every system in a comparison gets the same samples.
type Workload struct {
	Cluster  gpusim.Config
	Start    time.Time
	Ticks    int
	Interval time.Duration
	// Replica scrapes the cluster (default p0, no offset or jitter).
	Replica gpusim.Replica
	// External labels are added to every series (default cluster=<name>).
	// No __replica__ label by default: gpustore does not deduplicate HA
	// pairs yet, and a comparison must store the same series everywhere.
	External []gpusim.Label
	Protocol gpusim.Protocol // default 1.0
	// MaxSamplesPerSend caps a request (default 2000, Prometheus' default).
	MaxSamplesPerSend int
	// Shards is the number of independent request streams (default 4). As in
	// Prometheus' queue manager a series always goes to the same shard, so
	// its samples arrive in time order however the shards interleave.
	Shards int
	// NewClusterEachTick makes every tick the first scrape of another
	// cluster: the external cluster label is <name>-<tick>, so every sample
	// creates a new series (series churn at its worst: a fleet of clusters
	// starting to write, or a store filling up with a million series).
	NewClusterEachTick bool
}

func (w *Workload) defaults() error {
	if w.Interval <= 0 {
		w.Interval = 15 * time.Second
	}
	if w.Ticks <= 0 {
		return errors.New("workload: Ticks must be positive")
	}
	if w.Start.IsZero() {
		return errors.New("workload: Start is required")
	}
	if w.Replica.Name == "" {
		w.Replica.Name = "p0"
	}
	if w.Cluster.Name == "" {
		w.Cluster.Name = "gpu-cluster-bench"
	}
	if w.External == nil {
		w.External = []gpusim.Label{{Name: "cluster", Value: w.Cluster.Name}}
	}
	if w.Protocol == "" {
		w.Protocol = gpusim.ProtocolV1
	}
	if w.Protocol != gpusim.ProtocolV1 && w.Protocol != gpusim.ProtocolV2 {
		return fmt.Errorf("workload: protocol %q is not 1.0 or 2.0", w.Protocol)
	}
	if w.MaxSamplesPerSend <= 0 {
		w.MaxSamplesPerSend = 2000
	}
	if w.Shards <= 0 {
		w.Shards = 4
	}
	return nil
}

// End is the time of the last tick.
func (w Workload) End() time.Time { return w.Start.Add(time.Duration(w.Ticks-1) * w.Interval) }

// Request is one encoded remote-write body (snappy-compressed protobuf).
type Request struct {
	Body       []byte
	Samples    int
	MinT, MaxT int64 // sample timestamps, ms
}

// GenStats describes what a workload generated.
type GenStats struct {
	Samples int64
	Bytes   int64 // compressed request bodies
	// Series is the number of distinct series written (jobs churn, so more
	// than are active at any one tick); SeriesPerTick the most in one tick.
	Series, SeriesPerTick int
	MinT, MaxT            int64
	Requests              int64
	Took                  time.Duration
}

// generator turns ticks of the simulator into per-shard requests.
type generator struct {
	w       Workload
	cl      *gpusim.Cluster
	encs    []*gpusim.Encoder
	pending [][]gpusim.Series
	shardOf map[*gpusim.Label]int
	seen    map[uint64]struct{}
	buf     []gpusim.Series
	fresh   int // samples generated (NewClusterEachTick: series)
	st      GenStats
}

func newGenerator(w Workload) (*generator, error) {
	if err := w.defaults(); err != nil {
		return nil, err
	}
	cl, err := gpusim.New(w.Cluster)
	if err != nil {
		return nil, err
	}
	g := &generator{w: w, cl: cl, pending: make([][]gpusim.Series, w.Shards),
		shardOf: map[*gpusim.Label]int{}, seen: map[uint64]struct{}{}}
	for i := 0; i < w.Shards; i++ {
		g.encs = append(g.encs, gpusim.NewEncoder(w.External))
		g.pending[i] = make([]gpusim.Series, 0, w.MaxSamplesPerSend)
	}
	g.st.MinT, g.st.MaxT = -1, -1
	return g, nil
}

// shard returns the shard of a series: a hash of its labels, cached by the
// identity of its label slice (the simulator keeps one slice per series).
func (g *generator) shard(s *gpusim.Series) int {
	if len(s.Labels) == 0 {
		return 0
	}
	key := &s.Labels[0]
	if sh, ok := g.shardOf[key]; ok {
		return sh
	}
	h := fnv.New64a()
	for _, l := range s.Labels {
		h.Write([]byte(l.Name))
		h.Write([]byte{0xff})
		h.Write([]byte(l.Value))
		h.Write([]byte{0xff})
	}
	sum := h.Sum64()
	g.seen[sum] = struct{}{}
	sh := int(sum % uint64(len(g.encs)))
	g.shardOf[key] = sh
	return sh
}

// run generates every tick, calling emit for each full (and, at the end,
// each partial) batch in shard order of production.
func (g *generator) run(ctx context.Context, emit func(shard int, r Request) error) (GenStats, error) {
	began := time.Now()
	for i := 0; i < g.w.Ticks; i++ {
		if err := ctx.Err(); err != nil {
			return g.st, err
		}
		t := g.w.Start.Add(time.Duration(i) * g.w.Interval)
		if g.w.NewClusterEachTick {
			if err := g.newCluster(i, emit); err != nil {
				return g.st, err
			}
		}
		g.buf = g.cl.AppendSamples(g.buf[:0], t, g.w.Replica)
		g.st.SeriesPerTick = max(g.st.SeriesPerTick, len(g.buf))
		g.fresh += len(g.buf)
		for j := range g.buf {
			sh := g.shard(&g.buf[j])
			g.pending[sh] = append(g.pending[sh], g.buf[j])
			if len(g.pending[sh]) == g.w.MaxSamplesPerSend {
				if err := g.flush(sh, emit); err != nil {
					return g.st, err
				}
			}
		}
	}
	for sh := range g.pending {
		if err := g.flush(sh, emit); err != nil {
			return g.st, err
		}
	}
	g.st.Series = len(g.seen)
	if g.w.NewClusterEachTick {
		g.st.Series = g.fresh // every sample a series of its own
	}
	g.st.Took = time.Since(began)
	return g.st, nil
}

// newCluster sends what the previous tick left pending and gives every
// shard's encoder tick i's cluster label (Workload.NewClusterEachTick).
func (g *generator) newCluster(i int, emit func(int, Request) error) error {
	for sh := range g.pending {
		if err := g.flush(sh, emit); err != nil {
			return err
		}
	}
	ext := slices.DeleteFunc(slices.Clone(g.w.External), func(l gpusim.Label) bool { return l.Name == "cluster" })
	ext = append(ext, gpusim.Label{Name: "cluster", Value: fmt.Sprintf("%s-%05d", g.w.Cluster.Name, i)})
	for sh := range g.encs {
		g.encs[sh] = gpusim.NewEncoder(ext)
	}
	return nil
}

func (g *generator) flush(sh int, emit func(int, Request) error) error {
	batch := g.pending[sh]
	if len(batch) == 0 {
		return nil
	}
	var body []byte
	if g.w.Protocol == gpusim.ProtocolV2 {
		body = g.encs[sh].EncodeV2(batch)
	} else {
		body = g.encs[sh].EncodeV1(batch)
	}
	r := Request{Body: append([]byte(nil), body...), Samples: len(batch), MinT: batch[0].T, MaxT: batch[0].T}
	for _, s := range batch {
		r.MinT = min(r.MinT, s.T)
		r.MaxT = max(r.MaxT, s.T)
	}
	g.pending[sh] = batch[:0]
	g.st.Samples += int64(r.Samples)
	g.st.Bytes += int64(len(r.Body))
	g.st.Requests++
	if g.st.MinT < 0 || r.MinT < g.st.MinT {
		g.st.MinT = r.MinT
	}
	g.st.MaxT = max(g.st.MaxT, r.MaxT)
	return emit(sh, r)
}

// Source hands a driver the requests of each shard in order.
type Source interface {
	NumShards() int
	// Next returns shard's next request, or false when the shard is done.
	Next(ctx context.Context, shard int) (Request, bool)
	// Total is the number of samples the source will produce (0: unknown).
	Total() int64
}

// Plan is a workload encoded in memory ahead of time, so that generating it
// costs the machine nothing while a receiver is measured, and so that it can
// be replayed to several receivers byte for byte.
type Plan struct {
	Workload Workload
	Shards   [][]Request
	Stats    GenStats
}

// BuildPlan generates and encodes the whole workload.
func BuildPlan(ctx context.Context, w Workload) (*Plan, error) {
	g, err := newGenerator(w)
	if err != nil {
		return nil, err
	}
	p := &Plan{Workload: g.w, Shards: make([][]Request, g.w.Shards)}
	st, err := g.run(ctx, func(sh int, r Request) error {
		p.Shards[sh] = append(p.Shards[sh], r)
		return nil
	})
	p.Stats = st
	return p, err
}

// Source returns a fresh cursor over the plan; each call replays it from the
// start.
func (p *Plan) Source() Source {
	return &planSource{p: p, next: make([]int, len(p.Shards))}
}

type planSource struct {
	p    *Plan
	next []int // per shard; each shard is read by one goroutine
}

func (s *planSource) NumShards() int { return len(s.p.Shards) }
func (s *planSource) Total() int64   { return s.p.Stats.Samples }
func (s *planSource) Next(_ context.Context, sh int) (Request, bool) {
	if s.next[sh] >= len(s.p.Shards[sh]) {
		return Request{}, false
	}
	r := s.p.Shards[sh][s.next[sh]]
	s.next[sh]++
	return r, true
}

// Stream generates a workload while it is being sent: for backfills too large
// to hold in memory, where the generator's CPU use is acceptable.
type Stream struct {
	w     Workload
	total int64
	chans []chan Request
	done  chan struct{}
	mu    sync.Mutex
	st    GenStats
	err   error
}

// NewStream starts generating w in the background; ctx stops it.
func NewStream(ctx context.Context, w Workload) (*Stream, error) {
	g, err := newGenerator(w)
	if err != nil {
		return nil, err
	}
	s := &Stream{w: g.w, chans: make([]chan Request, g.w.Shards), done: make(chan struct{})}
	for i := range s.chans {
		s.chans[i] = make(chan Request, 32)
	}
	// The total is not known before generating; estimate it from the first tick.
	probe, err := gpusim.New(g.w.Cluster)
	if err != nil {
		return nil, err
	}
	s.total = int64(len(probe.AppendSamples(nil, g.w.Start, g.w.Replica))) * int64(g.w.Ticks)
	go func() {
		defer close(s.done)
		st, err := g.run(ctx, func(sh int, r Request) error {
			select {
			case s.chans[sh] <- r:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
		for _, c := range s.chans {
			close(c)
		}
		s.mu.Lock()
		s.st, s.err = st, err
		s.mu.Unlock()
	}()
	return s, nil
}

func (s *Stream) NumShards() int { return len(s.chans) }

// Total is an estimate: the first tick's series times the number of ticks.
func (s *Stream) Total() int64 { return s.total }

func (s *Stream) Next(ctx context.Context, sh int) (Request, bool) {
	select {
	case r, ok := <-s.chans[sh]:
		return r, ok
	case <-ctx.Done():
		return Request{}, false
	}
}

// Stats waits for the generator to finish and returns what it generated.
func (s *Stream) Stats() (GenStats, error) {
	<-s.done
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st, s.err
}
