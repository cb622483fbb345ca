package load

import (
	"context"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// The test binary doubles as a fake receiver for System's tests: with
// LOAD_FAKE_RECEIVER set to an address it serves the ready, write and flush
// paths until SIGTERM (or ignores SIGTERM when LOAD_FAKE_STUBBORN is set).
func TestMain(m *testing.M) {
	if addr := os.Getenv("LOAD_FAKE_RECEIVER"); addr != "" {
		fakeReceiver(addr)
		return
	}
	os.Exit(m.Run())
}

func fakeReceiver(addr string) {
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM)
	mux := http.NewServeMux()
	mux.HandleFunc("/-/ready", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/internal/force_flush", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/api/v1/write", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	srv := &http.Server{Addr: addr, Handler: mux}
	go func() { _ = srv.ListenAndServe() }()
	for range sig {
		if os.Getenv("LOAD_FAKE_STUBBORN") == "" {
			_ = srv.Close()
			os.Exit(0)
		}
	}
}

func fakeSystem(t *testing.T, stubborn bool) *System {
	t.Helper()
	addr, err := FreeAddr()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("LOAD_FAKE_RECEIVER", addr)
	if stubborn {
		t.Setenv("LOAD_FAKE_STUBBORN", "1")
	}
	return &System{Name: "fake", Bin: self, DataDir: filepath.Join(dir, "data"), Addr: addr,
		WritePath: "/api/v1/write", ReadyPath: "/-/ready", FlushPath: "/internal/force_flush", LogPath: filepath.Join(dir, "fake.log")}
}

func TestSystemLifecycle(t *testing.T) {
	s := fakeSystem(t, false)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = s.Stop(time.Second) }()
	ctx := context.Background()
	if err := s.WaitReady(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadProc(s.PID()); err != nil {
		t.Fatal(err)
	}
	if err := s.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	res, err := Run(ctx, DriverConfig{URL: s.WriteURL(), Logger: quietLogger(), Progress: -1}, newFakeSource(1, 3, 5))
	if err != nil || res.Samples != 15 {
		t.Fatalf("write to fake: %v, %v", res, err)
	}
	if err := s.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if s.Running() {
		t.Fatal("still running after Stop")
	}
	if err := s.Stop(time.Second); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
}

func TestSystemKilledWhenSIGTERMIgnored(t *testing.T) {
	s := fakeSystem(t, true)
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	if err := s.WaitReady(context.Background(), 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := s.Stop(300 * time.Millisecond); err == nil {
		t.Fatal("want an error saying it was killed")
	}
	if s.Running() {
		t.Fatal("still running after kill")
	}
}

func TestSystemArgs(t *testing.T) {
	g := Gpustore("bin/gpustore", "/d", "127.0.0.1:1")
	p := Prometheus("prometheus", "/d", "/c/prometheus.yml", "127.0.0.1:2")
	v := VictoriaMetrics("victoria-metrics", "/d", "127.0.0.1:3")
	want := map[*System][]string{
		g: {"-web.listen-address=127.0.0.1:1", "-storage.tsdb.path=/d", "-target=ingest,query,compact",
			"-compact.interval=10s", "-compact.delete-delay=0s", "-bucket-store.sync-interval=5s"},
		p: {"--config.file=/c/prometheus.yml", "--web.enable-remote-write-receiver", "--storage.tsdb.path=/d", "--web.listen-address=127.0.0.1:2"},
		v: {"-storageDataPath=/d", "-httpListenAddr=127.0.0.1:3", "-search.latencyOffset=0s"},
	}
	for s, args := range want {
		if len(s.Args) != len(args) {
			t.Errorf("%s args %q; want %q", s.Name, s.Args, args)
			continue
		}
		for i := range args {
			if s.Args[i] != args[i] {
				t.Errorf("%s args %q; want %q", s.Name, s.Args, args)
				break
			}
		}
	}
	if v.WriteURL() != "http://127.0.0.1:3/api/v1/write" || v.QueryParams.Get("nocache") != "1" || v.FlushPath == "" {
		t.Errorf("victoriametrics: %s %v %q", v.WriteURL(), v.QueryParams, v.FlushPath)
	}
}

// Running reports whether the process is alive.
func (s *System) Running() bool {
	if s.cmd == nil {
		return false
	}
	select {
	case <-s.exited:
		return false
	default:
		return true
	}
}
