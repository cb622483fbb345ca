package gpusim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"time"
)

// PageMode selects which pages the handler serves.
type PageMode string

// Page modes.
const (
	PagesCluster PageMode = "cluster" // one /metrics page for the whole cluster
	PagesNode    PageMode = "node"    // /node/<hostname>/metrics per node + /cluster/metrics
	PagesAll     PageMode = "all"     // both
)

// HandlerOptions configures NewHandler.
type HandlerOptions struct {
	Pages PageMode
	// Now returns the scrape time (default time.Now): values are computed
	// for it on every scrape.
	Now func() time.Time
}

// NewHandler serves the cluster in the Prometheus text format:
//
//	/metrics                  whole cluster (PagesCluster, PagesAll)
//	/node/<hostname>/metrics  one node's exporters (PagesNode, PagesAll);
//	                          503 while the node is down, as an unreachable
//	                          target looks to Prometheus
//	/cluster/metrics          kube-state-metrics (PagesNode, PagesAll)
//	/sd                       http_sd_configs target list of the per-node pages
//
// Scrapes are serialised: the Cluster is not safe for concurrent use.
func NewHandler(c *Cluster, opts HandlerOptions) http.Handler {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Pages == "" {
		opts.Pages = PagesAll
	}
	h := &handler{c: c, now: opts.Now}
	mux := http.NewServeMux()
	if opts.Pages == PagesCluster || opts.Pages == PagesAll {
		mux.HandleFunc("GET /metrics", h.cluster)
	}
	if opts.Pages == PagesNode || opts.Pages == PagesAll {
		mux.HandleFunc("GET /node/{host}/metrics", h.node)
		mux.HandleFunc("GET /cluster/metrics", h.clusterScope)
		mux.HandleFunc("GET /sd", h.sd)
	}
	mux.HandleFunc("GET /{$}", h.index)
	return mux
}

type handler struct {
	mu  sync.Mutex
	c   *Cluster
	now func() time.Time
	buf []byte
}

func (h *handler) write(w http.ResponseWriter, b []byte) {
	w.Header().Set("Content-Type", TextContentType)
	_, _ = w.Write(b)
}

func (h *handler) cluster(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.c.Step(h.now())
	h.buf = h.c.AppendText(h.buf[:0])
	h.write(w, h.buf)
}

func (h *handler) node(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	i, ok := h.c.nodeIndex(r.PathValue("host"))
	if !ok {
		http.Error(w, fmt.Sprintf("unknown node %q", r.PathValue("host")), http.StatusNotFound)
		return
	}
	now := h.now()
	if h.c.NodeDown(i, now) {
		http.Error(w, "node down (simulated)", http.StatusServiceUnavailable)
		return
	}
	if err := h.c.StepNode(i, now); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	h.buf, _ = h.c.AppendNodeText(h.buf[:0], i)
	h.write(w, h.buf)
}

func (h *handler) clusterScope(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.c.StepClusterScope(h.now())
	h.buf = h.c.AppendClusterScopeText(h.buf[:0])
	h.write(w, h.buf)
}

// sd answers Prometheus' http_sd_configs: one target group per node page,
// addressed at the host the scraper used to reach us.
func (h *handler) sd(w http.ResponseWriter, r *http.Request) {
	type group struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels"`
	}
	// instance names the node: every page shares one address, and the
	// node-exporter series of two pages would otherwise collide.
	groups := []group{{Targets: []string{r.Host}, Labels: map[string]string{"__metrics_path__": "/cluster/metrics", "instance": "kube-state-metrics"}}}
	for _, hn := range h.c.Hostnames() {
		groups = append(groups, group{Targets: []string{r.Host}, Labels: map[string]string{"__metrics_path__": "/node/" + hn + "/metrics", "instance": hn}})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(groups)
}

func (h *handler) index(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	fmt.Fprintf(w, "<html><body><h1>gpusim: %s</h1><ul><li><a href=\"/metrics\">/metrics</a> (whole cluster)</li><li><a href=\"/cluster/metrics\">/cluster/metrics</a> (kube-state-metrics)</li><li><a href=\"/sd\">/sd</a> (http_sd targets)</li>", h.c.Name())
	for _, hn := range h.c.Hostnames() {
		fmt.Fprintf(w, "<li><a href=\"/node/%s/metrics\">/node/%s/metrics</a></li>", hn, hn)
	}
	fmt.Fprint(w, "</ul></body></html>")
}
