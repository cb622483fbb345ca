// Package devstack runs deploy/compose's topology on loopback without
// containers: versitygw in place of MinIO, gpusim, gpustore, Alertmanager and
// the Prometheus HA pair, each a real process started from the config files
// compose.yaml mounts. Service addresses in those files ("gpustore:9201")
// and container paths ("/etc/prometheus/...") are mapped to loopback
// addresses and the repository's files; nothing else is changed. Grafana is
// not run (no Grafana binary can be installed here): use docker compose.
package devstack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"gopkg.in/yaml.v3"
)

// Binaries are the programs the stack runs.
type Binaries struct {
	Gpustore, Gpusim, Prometheus, Alertmanager, Versitygw string
}

// Config says where the stack runs.
type Config struct {
	// ComposeDir is deploy/compose: compose.yaml and the files it mounts.
	ComposeDir string
	// Dir holds every process's data, generated config and log.
	Dir  string
	Bins Binaries
	// FreePorts picks free loopback ports instead of compose's published
	// ones (tests, or a second stack).
	FreePorts bool
	// GpustoreArgs are added to gpustore's flags (they win over its file).
	GpustoreArgs []string
	Logger       *slog.Logger
}

// composeFile is the part of compose.yaml the stack reads.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
}

type composeService struct {
	Command     []string          `yaml:"command"`
	Entrypoint  []string          `yaml:"entrypoint"`
	Environment map[string]string `yaml:"environment"`
	Volumes     []string          `yaml:"volumes"`
	Ports       []string          `yaml:"ports"`
}

// Stack is a running dev stack.
type Stack struct {
	cfg   Config
	log   *slog.Logger
	addrs map[string]string // compose service -> 127.0.0.1:port
	procs []*proc
	// Bucket is the S3 bucket's directory under versitygw's posix root.
	Bucket string
}

// URL is the http URL of a compose service (gpustore, prometheus-0,
// alertmanager, gpusim, minio) on loopback.
func (s *Stack) URL(service string) string { return "http://" + s.addrs[service] }

type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
	err  error
}

// Start starts every service and waits until each is ready. On error, what
// was started is stopped.
func Start(ctx context.Context, cfg Config) (*Stack, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	b, err := os.ReadFile(filepath.Join(cfg.ComposeDir, "compose.yaml"))
	if err != nil {
		return nil, err
	}
	var cf composeFile
	if err := yaml.Unmarshal(b, &cf); err != nil {
		return nil, fmt.Errorf("compose.yaml: %w", err)
	}
	s := &Stack{cfg: cfg, log: cfg.Logger, addrs: map[string]string{}}
	mapping, err := s.assignPorts(cf)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return nil, err
	}
	steps := []func(context.Context, composeFile, *strings.Replacer) error{s.startS3, s.startAlertmanager, s.startGpustore, s.startGpusim, s.startPrometheusPair}
	for _, step := range steps {
		if err := step(ctx, cf, mapping); err != nil {
			return nil, errors.Join(err, s.Stop())
		}
	}
	s.log.Info("Grafana is not run by the dev stack (no Grafana binary here); `docker compose up` in deploy/compose runs it")
	return s, nil
}

// assignPorts gives every service with a published port a loopback address
// and returns the replacements from "service:containerPort" to it.
func (s *Stack) assignPorts(cf composeFile) (*strings.Replacer, error) {
	var pairs []string
	names := make([]string, 0, len(cf.Services))
	for n := range cf.Services {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, name := range names {
		for _, p := range cf.Services[name].Ports {
			parts := strings.Split(p, ":")
			published, target := parts[0], parts[len(parts)-1]
			if name == "minio" && target != "9000" {
				continue // the MinIO console has no versitygw equivalent
			}
			if _, ok := s.addrs[name]; ok {
				continue
			}
			port := published
			if s.cfg.FreePorts {
				var err error
				if port, err = freePort(); err != nil {
					return nil, err
				}
			}
			s.addrs[name] = "127.0.0.1:" + port
			pairs = append(pairs, name+":"+target, s.addrs[name])
		}
	}
	for _, need := range []string{"minio", "gpustore", "gpusim", "alertmanager"} {
		if s.addrs[need] == "" {
			return nil, fmt.Errorf("compose.yaml: service %s publishes no port", need)
		}
	}
	return strings.NewReplacer(pairs...), nil
}

func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	_, p, _ := net.SplitHostPort(l.Addr().String())
	return p, nil
}

// mounts copies a service's bind-mounted files into dir with the service
// addresses mapped, and returns the replacements from each container path to
// the copy (directories map to the repository's directory itself).
func (s *Stack) mounts(svc composeService, dir string, addrs *strings.Replacer) (map[string]string, error) {
	paths := map[string]string{}
	for _, v := range svc.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || !strings.HasPrefix(parts[0], ".") {
			continue // a named volume: the process's own data dir instead
		}
		src := filepath.Join(s.cfg.ComposeDir, parts[0])
		st, err := os.Stat(src)
		if err != nil {
			return nil, err
		}
		if st.IsDir() {
			paths[parts[1]] = src
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return nil, err
		}
		dst := filepath.Join(dir, filepath.Base(src))
		if err := os.WriteFile(dst, []byte(addrs.Replace(string(b))), 0o644); err != nil {
			return nil, err
		}
		paths[parts[1]] = dst
	}
	return paths, nil
}

// rewrite maps container paths in a file (rule_files in prometheus.yml) and
// in flags to the host paths.
func rewrite(s string, paths map[string]string) string {
	keys := make([]string, 0, len(paths))
	for k := range paths {
		keys = append(keys, k)
	}
	// Longest first, so /etc/prometheus/rules/x.yml wins over a parent.
	slices.SortFunc(keys, func(a, b string) int { return len(b) - len(a) })
	for _, k := range keys {
		s = strings.ReplaceAll(s, k, paths[k])
	}
	return s
}

func (s *Stack) serviceDir(name string) (string, error) {
	dir := filepath.Join(s.cfg.Dir, name)
	return dir, os.MkdirAll(dir, 0o755)
}

// flags returns the service's compose command with container paths mapped
// and the given flags replaced (name -> value; "" drops the flag).
func flags(cmd []string, paths map[string]string, set map[string]string) []string {
	var out []string
	seen := map[string]bool{}
	for _, a := range cmd {
		name, _, hasValue := strings.Cut(a, "=")
		if v, ok := set[name]; ok && hasValue {
			seen[name] = true
			if v != "" {
				out = append(out, name+"="+v)
			}
			continue
		}
		out = append(out, rewrite(a, paths))
	}
	for name, v := range set {
		if !seen[name] && v != "" {
			out = append(out, name+"="+v)
		}
	}
	return out
}

// startS3 runs versitygw as the stack's S3 server with MinIO's credentials
// and creates the bucket minio-init would (posix backend: a directory).
func (s *Stack) startS3(ctx context.Context, cf composeFile, _ *strings.Replacer) error {
	minio := cf.Services["minio"]
	user, pass := minio.Environment["MINIO_ROOT_USER"], minio.Environment["MINIO_ROOT_PASSWORD"]
	init := strings.Join(cf.Services["minio-init"].Entrypoint, " ")
	_, bucket, ok := strings.Cut(init, "mc mb --ignore-existing local/")
	if !ok || user == "" || pass == "" {
		return errors.New("compose.yaml: minio's root user or minio-init's bucket not found")
	}
	bucket = strings.Fields(bucket)[0]
	dir, err := s.serviceDir("s3")
	if err != nil {
		return err
	}
	s.Bucket = filepath.Join(dir, "data", bucket)
	if err := os.MkdirAll(s.Bucket, 0o755); err != nil {
		return err
	}
	if err := s.run("versitygw", s.cfg.Bins.Versitygw, nil, "--access", user, "--secret", pass, "--port", s.addrs["minio"], "posix", filepath.Join(dir, "data")); err != nil {
		return err
	}
	return s.wait(ctx, "versitygw", func() error {
		c, err := net.DialTimeout("tcp", s.addrs["minio"], time.Second)
		if err != nil {
			return err
		}
		return c.Close()
	})
}

func (s *Stack) startAlertmanager(ctx context.Context, cf composeFile, addrs *strings.Replacer) error {
	svc := cf.Services["alertmanager"]
	dir, err := s.serviceDir("alertmanager")
	if err != nil {
		return err
	}
	paths, err := s.mounts(svc, dir, addrs)
	if err != nil {
		return err
	}
	args := flags(svc.Command, paths, map[string]string{
		"--storage.path": filepath.Join(dir, "data"), "--web.listen-address": s.addrs["alertmanager"],
	})
	if err := s.run("alertmanager", s.cfg.Bins.Alertmanager, nil, args...); err != nil {
		return err
	}
	return s.waitHTTP(ctx, "alertmanager", s.URL("alertmanager")+"/-/ready")
}

func (s *Stack) startGpustore(ctx context.Context, cf composeFile, addrs *strings.Replacer) error {
	svc := cf.Services["gpustore"]
	dir, err := s.serviceDir("gpustore")
	if err != nil {
		return err
	}
	paths, err := s.mounts(svc, dir, addrs)
	if err != nil {
		return err
	}
	args := flags(svc.Command, paths, map[string]string{
		"--storage.tsdb.path": filepath.Join(dir, "data"), "--web.listen-address": s.addrs["gpustore"],
	})
	if err := s.run("gpustore", s.cfg.Bins.Gpustore, nil, append(args, s.cfg.GpustoreArgs...)...); err != nil {
		return err
	}
	return s.waitHTTP(ctx, "gpustore", s.URL("gpustore")+"/-/ready")
}

func (s *Stack) startGpusim(ctx context.Context, cf composeFile, _ *strings.Replacer) error {
	args := flags(cf.Services["gpusim"].Command, nil, map[string]string{"--web.listen-address": s.addrs["gpusim"]})
	if err := s.run("gpusim", s.cfg.Bins.Gpusim, nil, args...); err != nil {
		return err
	}
	return s.waitHTTP(ctx, "gpusim", s.URL("gpusim")+"/sd")
}

// startPrometheusPair starts every Prometheus service of compose.yaml (the
// HA pair), each with its own environment (PROMETHEUS_REPLICA).
func (s *Stack) startPrometheusPair(ctx context.Context, cf composeFile, addrs *strings.Replacer) error {
	var names []string
	for n := range cf.Services {
		if strings.HasPrefix(n, "prometheus-") {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	if len(names) < 2 {
		return fmt.Errorf("compose.yaml: %d Prometheus services, want an HA pair", len(names))
	}
	for _, name := range names {
		svc := cf.Services[name]
		dir, err := s.serviceDir(name)
		if err != nil {
			return err
		}
		paths, err := s.mounts(svc, dir, addrs)
		if err != nil {
			return err
		}
		// The Prometheus config names its rule files by container path.
		for c, h := range paths {
			if strings.HasSuffix(c, "prometheus.yml") {
				b, err := os.ReadFile(h)
				if err != nil {
					return err
				}
				if err := os.WriteFile(h, []byte(rewrite(string(b), paths)), 0o644); err != nil {
					return err
				}
			}
		}
		args := flags(svc.Command, paths, map[string]string{
			"--storage.tsdb.path": filepath.Join(dir, "data"), "--web.listen-address": s.addrs[name],
		})
		var env []string
		for k, v := range svc.Environment {
			env = append(env, k+"="+v)
		}
		if err := s.run(name, s.cfg.Bins.Prometheus, env, args...); err != nil {
			return err
		}
	}
	for _, name := range names {
		if err := s.waitHTTP(ctx, name, s.URL(name)+"/-/ready"); err != nil {
			return err
		}
	}
	return nil
}

func (s *Stack) run(name, bin string, env []string, args ...string) error {
	if bin == "" {
		return fmt.Errorf("%s: no binary", name)
	}
	logf, err := os.Create(filepath.Join(s.cfg.Dir, name+".log"))
	if err != nil {
		return err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), env...)
	// Own process group: a Ctrl-C in the terminal reaches only the stack,
	// which stops the services in order (the Prometheus pair first, while
	// gpustore still accepts their last remote writes). Pdeathsig stops a
	// service whose stack died without stopping it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: logf, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); close(p.done) }()
	s.procs = append(s.procs, p)
	s.log.Info("started", "service", name, "pid", cmd.Process.Pid, "addr", s.addrs[name], "log", logf.Name())
	return nil
}

func (s *Stack) wait(ctx context.Context, name string, ready func() error) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	p := s.procs[len(s.procs)-1]
	for {
		err := ready()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %v (see %s)", name, p.err, p.log.Name())
		case <-ctx.Done():
			return fmt.Errorf("%s not ready: %w (see %s)", name, err, p.log.Name())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

func (s *Stack) waitHTTP(ctx context.Context, name, url string) error {
	return s.wait(ctx, name, func() error {
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s: %s", url, resp.Status)
		}
		return nil
	})
}

// Stop shuts the services down in reverse order of start with SIGTERM (SIGKILL
// after 30 s) and reports any that did not exit cleanly.
func (s *Stack) Stop() error {
	var errs []error
	for i := len(s.procs) - 1; i >= 0; i-- {
		p := s.procs[i]
		select {
		case <-p.done:
			errs = append(errs, fmt.Errorf("%s had exited before the stop: %v (see %s)", p.name, p.err, p.log.Name()))
			p.log.Close()
			continue
		default:
		}
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
			if p.err != nil {
				errs = append(errs, fmt.Errorf("%s: %v (see %s)", p.name, p.err, p.log.Name()))
			}
		case <-time.After(30 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("%s did not stop within 30s of SIGTERM", p.name))
		}
		p.log.Close()
		s.log.Info("stopped", "service", p.name)
	}
	s.procs = nil
	return errors.Join(errs...)
}
