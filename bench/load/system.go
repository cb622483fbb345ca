package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// System is a receiver under test, run as a child process on loopback with
// its own data directory.
type System struct {
	Name, Version string
	Bin           string
	Args          []string
	DataDir       string
	Addr          string // host:port it listens on
	WritePath     string // remote write
	ReadyPath     string // 200 once it accepts writes and queries
	// FlushPath, when set, makes the system persist what it buffers in
	// memory (VictoriaMetrics' /internal/force_flush).
	FlushPath string
	// QueryParams are added to every query (VictoriaMetrics: nocache=1, so
	// its rollup result cache does not answer repeated rounds).
	QueryParams url.Values
	// QueryHeaders are added to every query (gpustore: Cache-Control:
	// no-store, so its results cache does not answer repeated rounds).
	QueryHeaders http.Header
	LogPath      string
	// Bucket is set for a system that keeps an object-store bucket inside
	// DataDir (gpustore's embedded default, DataDir/BucketDirName).
	Bucket bool
	// Compacts is set for a system that compacts its bucket (gpustore):
	// WaitCompacted waits for it before queries and disk are measured.
	Compacts bool

	cmd     *exec.Cmd
	logFile *os.File
	exited  chan struct{}
	waitErr error
}

// WriteURL is the remote-write endpoint.
func (s *System) WriteURL() string { return "http://" + s.Addr + s.WritePath }

// BaseURL is the root of the Prometheus-compatible query API.
func (s *System) BaseURL() string { return "http://" + s.Addr }

// PID is the running process' id (0 before Start).
func (s *System) PID() int {
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Gpustore describes gpustore built from the tree, running the ingest,
// query and compact roles: the other systems evaluate no rules, so gpustore's
// embedded GPU rule pack stays off. Like Prometheus compacting its local
// blocks, gpustore compacts the blocks the shipper uploads to the embedded
// FILESYSTEM bucket (<data>/bucket); the bench deletes compacted sources at
// once (delete delay 0, a pass every 10 s, a bucket-store sync every 5 s) so
// that queries and disk are measured on the settled store.
func Gpustore(bin, dataDir, addr string) *System {
	return &System{
		Name: "gpustore", Bin: bin, DataDir: dataDir, Addr: addr,
		Args: []string{"-web.listen-address=" + addr, "-storage.tsdb.path=" + dataDir, "-target=ingest,query,compact",
			"-compact.interval=10s", "-compact.delete-delay=0s", "-bucket-store.sync-interval=5s"},
		WritePath: "/api/v1/write", ReadyPath: "/-/ready",
		Bucket: true, Compacts: true,
		QueryHeaders: http.Header{"Cache-Control": {"no-store"}},
	}
}

// PrometheusConfig is an empty scrape configuration: Prometheus only
// receives remote write.
const PrometheusConfig = "# gpustore bench: remote-write receiver only, nothing scraped.\nglobal: {}\nscrape_configs: []\n"

// Prometheus describes Prometheus in remote-write-receiver mode. configFile
// must hold PrometheusConfig (WritePrometheusConfig) and lie outside dataDir.
func Prometheus(bin, dataDir, configFile, addr string) *System {
	return &System{
		Name: "prometheus", Bin: bin, DataDir: dataDir, Addr: addr,
		Args: []string{"--config.file=" + configFile, "--web.enable-remote-write-receiver",
			"--storage.tsdb.path=" + dataDir, "--web.listen-address=" + addr},
		WritePath: "/api/v1/write", ReadyPath: "/-/ready",
	}
}

// WritePrometheusConfig writes PrometheusConfig to path.
func WritePrometheusConfig(path string) error {
	return os.WriteFile(path, []byte(PrometheusConfig), 0o644)
}

// VictoriaMetrics describes single-node VictoriaMetrics. Queries carry
// nocache=1: every system then computes every round from its storage.
func VictoriaMetrics(bin, dataDir, addr string) *System {
	return &System{
		Name: "victoriametrics", Bin: bin, DataDir: dataDir, Addr: addr,
		Args: []string{"-storageDataPath=" + dataDir, "-httpListenAddr=" + addr,
			"-search.latencyOffset=0s"},
		WritePath: "/api/v1/write", ReadyPath: "/health", FlushPath: "/internal/force_flush",
		QueryParams: url.Values{"nocache": {"1"}},
	}
}

// FreeAddr returns a loopback address with a port free at the time of the
// call.
func FreeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// Start runs the system with its output in LogPath (or discarded). The child
// gets SIGTERM if this process dies, so an interrupted benchmark leaves no
// server behind.
func (s *System) Start() error {
	if s.cmd != nil {
		return fmt.Errorf("%s: already started", s.Name)
	}
	if err := os.MkdirAll(s.DataDir, 0o755); err != nil {
		return fmt.Errorf("%s: %w", s.Name, err)
	}
	cmd := exec.Command(s.Bin, s.Args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if s.LogPath != "" {
		f, err := os.Create(s.LogPath)
		if err != nil {
			return fmt.Errorf("%s: log: %w", s.Name, err)
		}
		s.logFile = f
		cmd.Stdout, cmd.Stderr = f, f
	}
	if err := cmd.Start(); err != nil {
		if s.logFile != nil {
			s.logFile.Close()
		}
		return fmt.Errorf("start %s (%s): %w", s.Name, s.Bin, err)
	}
	s.cmd = cmd
	s.exited = make(chan struct{})
	go func() {
		s.waitErr = cmd.Wait()
		close(s.exited)
	}()
	return nil
}

// WaitReady polls ReadyPath until it answers 200, the process exits, or
// timeout passes.
func (s *System) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Addr+s.ReadyPath, nil)
		if resp, err := client.Do(req); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-s.exited:
			return fmt.Errorf("%s exited before it was ready: %v (log: %s)", s.Name, s.waitErr, s.LogPath)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %s (log: %s)", s.Name, timeout, s.LogPath)
		}
	}
}

// Flush asks the system to persist buffered data (no-op without FlushPath).
func (s *System) Flush(ctx context.Context) error {
	if s.FlushPath == "" {
		return nil
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.Addr+s.FlushPath, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("%s flush: %w", s.Name, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("%s flush: HTTP %d", s.Name, resp.StatusCode)
	}
	return nil
}

// Stop sends SIGTERM and waits up to timeout for a clean exit, then kills
// the process. It is safe to call more than once and on a system that never
// started.
func (s *System) Stop(timeout time.Duration) error {
	if s.cmd == nil {
		return nil
	}
	defer func() {
		if s.logFile != nil {
			s.logFile.Close()
			s.logFile = nil
		}
	}()
	select {
	case <-s.exited:
		return nil
	default:
	}
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.exited:
		var ee *exec.ExitError
		if s.waitErr != nil && !errors.As(s.waitErr, &ee) {
			return fmt.Errorf("%s: %w", s.Name, s.waitErr)
		}
		return nil
	case <-time.After(timeout):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("%s did not stop within %s after SIGTERM; killed", s.Name, timeout)
	}
}
