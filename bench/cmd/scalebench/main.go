// Command scalebench pushes one remote-write receiver to millions of active
// series in steps, at a real 15 s cadence, and reads what holding them costs
// from the receiver's own /metrics (issue 41 item 1, bench/RESULTS.md "Scale
// model").
//
// The series are gpusim's: one scrape of a simulated cluster (HGX nodes,
// dcgm-exporter, node-exporter, kube-state-metrics, training series, target
// labels), repeated under cluster=<name>-<k> until a step's count is reached.
// Each series is encoded once into remote-write 1.0 protobuf with a
// fixed-width sample, and every tick only its value and timestamp are
// patched before snappy: encoding costs the driver little next to what the
// receiver does, so the shared second core is left to the receiver.
//
// Job churn replaces the pod label of a share of the series that carry one
// (the DCGM, cAdvisor, training and kube-state series of GPUs running jobs),
// as gpusim's jobs do when they end and new pods start: -churn.per-hour is
// the share of those series replaced per hour. The default, 0.7, matches
// gpusim's own churn: 16 HGX nodes over a simulated day create 67.6 k new
// series beside the 36.5 k active at any tick (7.7 % of the active series
// per hour), and 11 % of the series carry a pod label.
//
//	scalebench -url=http://127.0.0.1:9201 -steps=500000,1000000 -pid=$PID
//	scalebench -url=... -steps=3000000 -once -at=now   # one tick: cut the head
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/golang/snappy"

	"github.com/gpustore/gpustore/bench/gpusim"
	"github.com/gpustore/gpustore/bench/load"
)

func main() { os.Exit(exitCode()) }

// exitCode is main's body: it returns the exit code, so the deferred stop runs.
func exitCode() int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "scalebench:", err)
		return 1
	}
	return 0
}

type options struct {
	url           string
	steps         []int
	nodes         int
	nodeCPUs      int
	workers       int
	batch         int
	interval      time.Duration
	warm, measure int
	churnPerHour  float64
	start         string
	once          bool
	paced         bool
	pid           int
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("scalebench", flag.ContinueOnError)
	var o options
	var steps string
	fs.StringVar(&o.url, "url", "http://127.0.0.1:9201", "Receiver's base URL (/api/v1/write and /metrics).")
	fs.StringVar(&steps, "steps", "500000,1000000,2000000,3000000", "Active series per step, ascending.")
	fs.IntVar(&o.nodes, "cluster.nodes", 128, "Nodes per simulated cluster (each copy is one cluster label).")
	fs.IntVar(&o.nodeCPUs, "cluster.node-cpus", gpusim.HGXNodeCPUs, "Logical CPUs per node (node_cpu_seconds_total series).")
	fs.IntVar(&o.workers, "workers", 8, "Requests in flight.")
	fs.IntVar(&o.batch, "batch", 2000, "Samples per request.")
	fs.DurationVar(&o.interval, "interval", 15*time.Second, "Scrape interval (real time between ticks).")
	fs.IntVar(&o.warm, "warm", 2, "Ticks after a step's first (which creates its series) before measuring.")
	fs.IntVar(&o.measure, "measure", 4, "Ticks measured per step.")
	fs.Float64Var(&o.churnPerHour, "churn.per-hour", 0.7, "Share of the pod-labelled series replaced per hour (job churn).")
	fs.StringVar(&o.start, "start", "", "Sample time of the first tick (RFC 3339; empty: now). Later ticks advance by -interval.")
	fs.BoolVar(&o.once, "once", false, "Send one tick of the last step's series and exit (to cut the head at a later time).")
	fs.BoolVar(&o.paced, "paced", true, "Send a tick every -interval of real time; false sends them back to back (hours of head in minutes: memory, not CPU per second).")
	fs.IntVar(&o.pid, "pid", 0, "Receiver's pid, for VmHWM (0: not read).")
	if err := fs.Parse(args); err != nil {
		return err
	}
	for _, s := range strings.Split(steps, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			return fmt.Errorf("-steps: %q", s)
		}
		o.steps = append(o.steps, n)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	t0 := time.Now()
	if o.start != "" {
		var err error
		if t0, err = time.Parse(time.RFC3339, o.start); err != nil {
			return fmt.Errorf("-start: %w", err)
		}
	}
	t0 = t0.Truncate(o.interval)
	began := time.Now()
	set, err := buildSeries(o, slices.Max(o.steps), t0)
	if err != nil {
		return err
	}
	log.Info("series encoded", "series", len(set.series), "with_pod", set.withPod, "batches", len(set.batches), "took", time.Since(began).Round(time.Millisecond))
	d := &driver{o: o, set: set, client: &http.Client{Timeout: 60 * time.Second}, log: log}
	if o.once {
		d.active = len(set.batches)
		st := d.tick(ctx, t0.UnixMilli(), 0)
		fmt.Fprintf(stdout, "one tick at %s: %d samples in %s, non-2xx %d\n", t0.UTC().Format(time.RFC3339), st.samples, st.took.Round(time.Millisecond), st.bad)
		return nil
	}
	fmt.Fprintln(stdout, "| active series (step) | head series | RSS | Go heap in use | CPU cores | core-s per M samples | samples/s sent | head appends/s | tick send max | p99 request | non-2xx | new series by churn |")
	fmt.Fprintln(stdout, "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
	tick := 0
	for _, n := range o.steps {
		d.active = (n + o.batch - 1) / o.batch
		var m0 metricsSnap
		var sent, churned int64
		var lat []time.Duration
		var maxTook time.Duration
		var bad int64
		for i := 0; i < 1+o.warm+o.measure; i++ {
			next := began.Add(time.Duration(tick) * o.interval)
			if w := time.Until(next); w > 0 && o.paced {
				select {
				case <-time.After(w):
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			if i == 1+o.warm {
				if m0, err = d.scrape(ctx); err != nil {
					return err
				}
			}
			c := d.churn(tick)
			st := d.tick(ctx, t0.Add(time.Duration(tick)*o.interval).UnixMilli(), tick)
			tick++
			if i == 0 { // creating the step's series may take longer than a tick: restart the cadence
				began = time.Now().Add(-time.Duration(tick-1) * o.interval)
			}
			if o.paced || i%40 == 0 {
				log.Info("tick", "step", n, "i", i, "samples", st.samples, "took", st.took.Round(time.Millisecond), "non2xx", st.bad)
			}
			if i > o.warm {
				sent += st.samples
				churned += c
				lat = append(lat, st.lat...)
				maxTook = max(maxTook, st.took)
				bad += st.bad
			}
		}
		// the measured window ends a tick after the last measured tick began
		next := began.Add(time.Duration(tick) * o.interval)
		if w := time.Until(next); w > 0 && o.paced {
			select {
			case <-time.After(w):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		m1, err := d.scrape(ctx)
		if err != nil {
			return err
		}
		secs := m1.at.Sub(m0.at).Seconds()
		cpu := m1.cpu - m0.cpu
		fmt.Fprintf(stdout, "| %d | %.0f | %s | %s | %.3f | %.2f | %.0f | %.0f | %s | %s | %d | %d |\n",
			n, m1.headSeries, mib(m1.rss), mib(m1.heap), cpu/secs, cpu/float64(sent)*1e6,
			float64(sent)/secs, (m1.appended-m0.appended)/secs, maxTook.Round(time.Millisecond), p99(lat).Round(time.Millisecond), bad, churned)
		if o.pid > 0 {
			if p, err := load.ReadProc(o.pid); err == nil {
				fmt.Fprintf(stdout, "<!-- step %d: VmHWM %s -->\n", n, mib(float64(p.HWM)))
			}
		}
	}
	return nil
}

func mib(b float64) string { return fmt.Sprintf("%.0f MiB", b/(1<<20)) }

func p99(l []time.Duration) time.Duration {
	if len(l) == 0 {
		return 0
	}
	slices.Sort(l)
	return l[min(len(l)-1, int(math.Ceil(0.99*float64(len(l))))-1)]
}

// series is one encoded series: its TimeSeries message with a fixed-width
// sample at the end, and how its value moves.
type series struct {
	src     int32 // index in seriesSet.one
	cluster int32 // copy of the cluster: the cluster label's number
	podIdx  int16 // index of the pod label in one[src], -1 if none
	gen     int32 // churn generation of the pod label
	v0, inc float64
}

type batch struct {
	first, n int
	body     []byte // WriteRequest, uncompressed
	valOff   []int  // offsets of each sample's 8-byte value; the timestamp follows
}

type seriesSet struct {
	one     []gpusim.Series // one scrape of the cluster, labels sorted
	series  []series
	batches []*batch
	withPod int
	podBat  []int // batches holding pod-labelled series
}

// buildSeries takes gpusim's first scrape of a cluster and repeats it under
// new cluster labels until n series, in batches of o.batch.
func buildSeries(o options, n int, t0 time.Time) (*seriesSet, error) {
	cl, err := gpusim.New(gpusim.Config{Name: "scale", Nodes: o.nodes, GPUsPerNode: 8, Seed: 1, TargetLabels: true, NodeCPUs: o.nodeCPUs})
	if err != nil {
		return nil, err
	}
	one := cl.AppendSamples(nil, t0, gpusim.Replica{Name: "p0"})
	set := &seriesSet{one: one}
	for k := 0; len(set.series) < n; k++ {
		for src, s := range one {
			if len(set.series) == n {
				break
			}
			se := series{src: int32(src), cluster: int32(k), podIdx: -1, v0: s.V}
			for i, l := range s.Labels {
				if l.Name == "pod" {
					se.podIdx = int16(i)
					set.withPod++
				}
			}
			if name := s.Name(); strings.HasSuffix(name, "_total") || strings.HasSuffix(name, "_count") ||
				strings.HasSuffix(name, "_sum") || strings.HasSuffix(name, "_bucket") || strings.Contains(name, "ENERGY") {
				se.inc = 1 + float64(len(set.series)%97) // a counter
			}
			set.series = append(set.series, se)
		}
	}
	for first := 0; first < n; first += o.batch {
		b := &batch{first: first, n: min(o.batch, n-first)}
		set.encode(b)
		set.batches = append(set.batches, b)
		for i := first; i < first+b.n; i++ {
			if set.series[i].podIdx >= 0 {
				set.podBat = append(set.podBat, len(set.batches)-1)
				break
			}
		}
	}
	return set, nil
}

func appendVarint(b []byte, v uint64) []byte { return binary.AppendUvarint(b, v) }

// appendLabel appends a TimeSeries' Label field.
func appendLabel(b []byte, name, value string) []byte {
	b = append(b, 1<<3|2)
	b = appendVarint(b, uint64(2+len(name)+2+len(value)+varLen(len(name))-1+varLen(len(value))-1))
	return appendString(appendString(b, 1, name), 2, value)
}

func varLen(n int) int { return len(binary.AppendUvarint(nil, uint64(n))) }

func appendString(b []byte, field byte, s string) []byte {
	b = append(b, field<<3|2)
	b = appendVarint(b, uint64(len(s)))
	return append(b, s...)
}

// encode writes b's WriteRequest: per series a TimeSeries of its labels and
// one Sample whose value (fixed64) and timestamp (a 6-byte varint, which
// holds every millisecond timestamp from 2004 to 2109) are patched per tick.
func (set *seriesSet) encode(b *batch) {
	var body, ts []byte
	b.valOff = b.valOff[:0]
	for i := b.first; i < b.first+b.n; i++ {
		s := &set.series[i]
		ts = ts[:0]
		cluster := false
		for j, l := range set.one[s.src].Labels {
			if !cluster && l.Name > "cluster" {
				ts = appendLabel(ts, "cluster", fmt.Sprintf("scale-%03d", s.cluster))
				cluster = true
			}
			v := l.Value
			if j == int(s.podIdx) && s.gen > 0 {
				v = fmt.Sprintf("%s-g%d", v, s.gen)
			}
			ts = appendLabel(ts, l.Name, v)
		}
		if !cluster {
			ts = appendLabel(ts, "cluster", fmt.Sprintf("scale-%03d", s.cluster))
		}
		ts = append(ts, 2<<3|2, 16, 1<<3|1)
		valAt := len(ts)
		ts = append(ts, make([]byte, 8)...)
		ts = append(ts, 2<<3) // field 2, varint
		ts = append(ts, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00)
		body = append(body, 1<<3|2)
		body = appendVarint(body, uint64(len(ts)))
		b.valOff = append(b.valOff, len(body)+valAt)
		body = append(body, ts...)
	}
	b.body = body
}

func patch(b *batch, set *seriesSet, tms int64, tick int) {
	for j, off := range b.valOff {
		s := &set.series[b.first+j]
		v := s.v0 + s.inc*float64(tick)
		if s.inc == 0 && (b.first+j+tick)%4 == 0 { // a gauge moves on one tick in four
			v = s.v0 + float64((b.first+j*7+tick)%5) - 2
		}
		binary.LittleEndian.PutUint64(b.body[off:], math.Float64bits(v))
		t := uint64(tms)
		p := b.body[off+9 : off+15]
		for k := 0; k < 5; k++ {
			p[k] = byte(t) | 0x80
			t >>= 7
		}
		p[5] = byte(t)
	}
}

type driver struct {
	o      options
	set    *seriesSet
	client *http.Client
	log    *slog.Logger
	active int // batches sent per tick
	churnQ float64
}

// churn replaces the pod label of the pod-labelled series of enough active
// batches to keep -churn.per-hour, and returns the series it replaced.
func (d *driver) churn(tick int) int64 {
	var pods []int
	for _, bi := range d.set.podBat {
		if bi < d.active {
			pods = append(pods, bi)
		}
	}
	if len(pods) == 0 || tick == 0 {
		return 0
	}
	d.churnQ += d.o.churnPerHour * float64(len(pods)) * d.o.interval.Hours()
	var n int64
	for ; d.churnQ >= 1; d.churnQ-- {
		b := d.set.batches[pods[(tick*7919+int(d.churnQ))%len(pods)]]
		for i := b.first; i < b.first+b.n; i++ {
			if s := &d.set.series[i]; s.podIdx >= 0 {
				s.gen++
				n++
			}
		}
		d.set.encode(b)
	}
	return n
}

type tickStats struct {
	samples, bad int64
	took         time.Duration
	lat          []time.Duration
}

// tick sends one sample of every active series, d.o.workers requests at a time.
func (d *driver) tick(ctx context.Context, tms int64, tick int) tickStats {
	began := time.Now()
	var next, samples, bad atomic.Int64
	var mu sync.Mutex
	var lat []time.Duration
	var wg sync.WaitGroup
	for w := 0; w < d.o.workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var comp []byte
			for {
				i := int(next.Add(1) - 1)
				if i >= d.active || ctx.Err() != nil {
					return
				}
				b := d.set.batches[i]
				patch(b, d.set, tms, tick)
				comp = snappy.Encode(comp[:cap(comp)], b.body)
				for attempt := 0; attempt < 5; attempt++ {
					t := time.Now()
					code := d.post(ctx, comp)
					el := time.Since(t)
					mu.Lock()
					lat = append(lat, el)
					mu.Unlock()
					if code/100 == 2 {
						samples.Add(int64(b.n))
						break
					}
					bad.Add(1)
					if code/100 == 4 && code != 429 {
						break
					}
					time.Sleep(time.Duration(attempt+1) * 500 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	return tickStats{samples: samples.Load(), bad: bad.Load(), took: time.Since(began), lat: lat}
}

func (d *driver) post(ctx context.Context, body []byte) int {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.o.url+"/api/v1/write", bytes.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("Content-Encoding", "snappy")
	req.Header.Set("Content-Type", gpusim.ContentTypeV1)
	req.Header.Set("X-Prometheus-Remote-Write-Version", "0.1.0")
	resp, err := d.client.Do(req)
	if err != nil {
		d.log.Warn("write", "err", err)
		return 0
	}
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		d.log.Warn("write", "code", resp.StatusCode, "body", string(msg))
	}
	return resp.StatusCode
}

type metricsSnap struct {
	at                                   time.Time
	cpu, rss, heap, headSeries, appended float64
}

// scrape reads the receiver's own /metrics: process CPU and RSS, the Go heap
// in use, and the TSDB head's series and appended samples summed over tenants.
func (d *driver) scrape(ctx context.Context) (metricsSnap, error) {
	m := metricsSnap{at: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, d.o.url+"/metrics", nil)
	if err != nil {
		return m, err
	}
	resp, err := d.client.Do(req)
	if err != nil {
		return m, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		name := line[:sp]
		if i := strings.IndexByte(name, '{'); i >= 0 {
			name = name[:i]
		}
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		switch name {
		case "process_cpu_seconds_total":
			m.cpu = v
		case "process_resident_memory_bytes":
			m.rss = v
		case "go_memstats_heap_inuse_bytes":
			m.heap = v
		case "prometheus_tsdb_head_series":
			m.headSeries += v
		case "prometheus_tsdb_head_samples_appended_total":
			m.appended += v
		}
	}
	return m, sc.Err()
}
