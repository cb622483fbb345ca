package rules

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/model"

	"github.com/gpustore/gpustore/internal/testbin"
)

// dnsServer is a DNS server (miekg/dns, over UDP on loopback) answering A
// and SRV questions from records the test changes while it runs.
type dnsServer struct {
	addr string
	mu   sync.Mutex
	a    map[string][]string    // name -> IPv4 addresses
	srv  map[string][]*mdns.SRV // name -> records
}

func startDNS(t *testing.T) *dnsServer {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	d := &dnsServer{addr: pc.LocalAddr().String(), a: map[string][]string{}, srv: map[string][]*mdns.SRV{}}
	srv := &mdns.Server{PacketConn: pc, Handler: d}
	go func() { _ = srv.ActivateAndServe() }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return d
}

func (d *dnsServer) ServeDNS(w mdns.ResponseWriter, req *mdns.Msg) {
	m := new(mdns.Msg)
	m.SetReply(req)
	m.Authoritative = true
	d.mu.Lock()
	for _, q := range req.Question {
		hdr := mdns.RR_Header{Name: q.Name, Class: mdns.ClassINET, Ttl: 0, Rrtype: q.Qtype}
		switch q.Qtype {
		case mdns.TypeA:
			for _, ip := range d.a[q.Name] {
				m.Answer = append(m.Answer, &mdns.A{Hdr: hdr, A: net.ParseIP(ip)})
			}
		case mdns.TypeSRV:
			for _, r := range d.srv[q.Name] {
				rr := *r
				rr.Hdr = hdr
				m.Answer = append(m.Answer, &rr)
			}
		}
	}
	if len(m.Answer) == 0 && len(d.a[req.Question[0].Name]) == 0 && len(d.srv[req.Question[0].Name]) == 0 {
		m.Rcode = mdns.RcodeNameError
	}
	d.mu.Unlock()
	_ = w.WriteMsg(m)
}

func (d *dnsServer) setA(name string, ips ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.a[name] = ips
}

func (d *dnsServer) setSRV(name string, targets ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.srv[name] = nil
	for _, hp := range targets {
		host, port, _ := net.SplitHostPort(hp)
		p, _ := strconv.Atoi(port)
		d.srv[name] = append(d.srv[name], &mdns.SRV{Target: host, Port: uint16(p), Priority: 10, Weight: 50})
	}
}

// resolver is Go's own resolver asking only this server.
func (d *dnsServer) resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var dialer net.Dialer
		return dialer.DialContext(ctx, "udp", d.addr)
	}}
}

// startAlertmanager runs the real Alertmanager (no cluster port) on addr and
// returns its base URL.
func startAlertmanager(t *testing.T, bin, addr string) string {
	t.Helper()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(cfg, []byte("route: {receiver: none}\nreceivers: [{name: none}]\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--cluster.listen-address=", "--log.level=warn")
	out, err := os.Create(filepath.Join(dir, "log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		_ = out.Close()
		if t.Failed() {
			b, _ := os.ReadFile(out.Name())
			t.Logf("alertmanager %s log:\n%s", addr, b)
		}
	})
	base := "http://" + addr
	waitFor(t, 30*time.Second, "alertmanager "+addr+" ready", func() error {
		resp, err := http.Get(base + "/-/ready")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	return base
}

// alertNames lists the alerts an Alertmanager holds.
func alertNames(base string) ([]string, error) {
	resp, err := http.Get(base + "/api/v2/alerts")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var alerts []struct {
		Labels map[string]string `json:"labels"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&alerts); err != nil {
		return nil, err
	}
	var names []string
	for _, a := range alerts {
		names = append(names, a.Labels["alertname"])
	}
	return names, nil
}

// freePort is a TCP port free on every given loopback IP.
func freePort(t *testing.T, ips ...string) string {
	t.Helper()
	for range 20 {
		l, err := net.Listen("tcp", ips[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		_, port, _ := net.SplitHostPort(l.Addr().String())
		free := true
		for _, ip := range ips[1:] {
			if l2, err := net.Listen("tcp", net.JoinHostPort(ip, port)); err != nil {
				free = false
			} else {
				l2.Close()
			}
		}
		l.Close()
		if free {
			return port
		}
	}
	t.Fatal("no port free on every IP")
	return ""
}

// Every replica of an HA Alertmanager that DNS names gets every alert: the
// replicas of an SRV record (as a Kubernetes headless Service publishes for
// a named port), including one the record gains while gpustore runs, and
// every address of an A lookup at the URL's port. Real Alertmanagers, a real
// DNS server on loopback asked by Go's resolver.
func TestAlertsToEveryDiscoveredAlertmanager(t *testing.T) {
	bin := testbin.Need(t, "alertmanager")
	for _, tc := range []struct {
		name string
		url  string
		// start returns the replicas' base URLs, setting the records that
		// name the first `initial` of them.
		start   func(t *testing.T, d *dnsServer) []string
		initial int
	}{
		{
			name: "dnssrv", url: "dnssrv+http://_web._tcp.alertmanager-operated.monitoring.test.",
			start: func(t *testing.T, d *dnsServer) []string {
				p0, p1 := freePort(t, "127.0.0.1"), freePort(t, "127.0.0.1")
				d.setA("alertmanager-0.alertmanager-operated.monitoring.test.", "127.0.0.1")
				d.setA("alertmanager-1.alertmanager-operated.monitoring.test.", "127.0.0.1")
				d.setSRV("_web._tcp.alertmanager-operated.monitoring.test.", "alertmanager-0.alertmanager-operated.monitoring.test.:"+p0)
				return []string{startAlertmanager(t, bin, "127.0.0.1:"+p0), startAlertmanager(t, bin, "127.0.0.1:"+p1)}
			},
			initial: 1,
		},
		{
			// No DNS: the replicas listed one by one.
			name: "list", url: "http://127.0.0.1:%s,http://127.0.0.1:%s",
			start: func(t *testing.T, d *dnsServer) []string {
				return []string{startAlertmanager(t, bin, "127.0.0.1:"+freePort(t, "127.0.0.1")), startAlertmanager(t, bin, "127.0.0.1:"+freePort(t, "127.0.0.1"))}
			},
			initial: 2,
		},
		{
			name: "dns", url: "dns+http://alertmanager-operated.monitoring.test:%s",
			start: func(t *testing.T, d *dnsServer) []string {
				p := freePort(t, "127.0.0.1", "127.0.0.2")
				d.setA("alertmanager-operated.monitoring.test.", "127.0.0.1", "127.0.0.2")
				return []string{startAlertmanager(t, bin, "127.0.0.1:"+p), startAlertmanager(t, bin, "127.0.0.2:"+p)}
			},
			initial: 2,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := startDNS(t)
			ams := tc.start(t, d)
			var ports []any
			for _, am := range ams {
				_, port, _ := net.SplitHostPort(strings.TrimPrefix(am, "http://"))
				ports = append(ports, port)
			}
			urls := strings.Split(tc.url, ",")
			for i, u := range urls {
				if strings.Contains(u, "%s") {
					urls[i] = fmt.Sprintf(u, ports[i])
				}
			}
			e := newEnv(t, func(c *Config) {
				c.Alertmanager.URLs = urls
				c.Alertmanager.RefreshInterval = model.Duration(500 * time.Millisecond)
				c.ResendDelay = model.Duration(200 * time.Millisecond)
			})
			e.replaceRuler(func(o *Options) { o.Resolver = d.resolver() })
			e.writeRules("team-a", "always.yml", "groups:\n  - name: always\n    interval: 200ms\n    rules:\n      - alert: Always\n        expr: vector(1)\n")
			e.start()

			received := func(want []string) func() error {
				return func() error {
					for _, am := range want {
						names, err := alertNames(am)
						if err != nil {
							return err
						}
						if !slices.Contains(names, "Always") {
							return fmt.Errorf("%s holds %v", am, names)
						}
					}
					return nil
				}
			}
			waitFor(t, 15*time.Second, "the alert at the replicas DNS names", received(ams[:tc.initial]))
			if tc.initial < len(ams) {
				// A replica joins the record (scale-up, a pod rescheduled):
				// it gets the alerts too.
				d.setSRV("_web._tcp.alertmanager-operated.monitoring.test.",
					fmt.Sprintf("alertmanager-0.alertmanager-operated.monitoring.test.:%s", ports[0]),
					fmt.Sprintf("alertmanager-1.alertmanager-operated.monitoring.test.:%s", ports[1]))
				waitFor(t, 15*time.Second, "the alert at the replica that joined the record", received(ams))
			}
			if n := testutil.ToFloat64(e.ruler.amTargets.failures); n != 0 {
				t.Errorf("%v lookups failed", n)
			}
		})
	}
}
