// Command devstack runs gpustore's whole system on loopback without
// containers (`make dev-stack`): versitygw as the S3 server, the simulated
// GPU cluster, gpustore, Alertmanager and a Prometheus HA pair, from the
// config files of deploy/compose. Ctrl-C stops it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/gpustore/gpustore/deploy/devstack"
	"github.com/gpustore/gpustore/internal/testbin"
)

func main() {
	var cfg devstack.Config
	flag.StringVar(&cfg.ComposeDir, "compose-dir", "deploy/compose", "deploy/compose: compose.yaml and the files it mounts.")
	flag.StringVar(&cfg.Dir, "dir", "data/dev-stack", "Data, generated configs and logs of every service.")
	flag.StringVar(&cfg.Bins.Gpustore, "gpustore", "bin/gpustore", "gpustore binary.")
	flag.StringVar(&cfg.Bins.Gpusim, "gpusim", "bin/gpusim", "gpusim binary.")
	flag.StringVar(&cfg.Bins.Prometheus, "prometheus", testbin.Lookup("prometheus"), "Prometheus binary (make tools).")
	flag.StringVar(&cfg.Bins.Alertmanager, "alertmanager", testbin.Lookup("alertmanager"), "Alertmanager binary (make tools).")
	flag.StringVar(&cfg.Bins.Versitygw, "versitygw", testbin.Lookup("versitygw"), "versitygw binary (make tools).")
	flag.BoolVar(&cfg.FreePorts, "free-ports", false, "Use free loopback ports instead of compose.yaml's published ports.")
	flag.Parse()
	cfg.GpustoreArgs = flag.Args()
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))

	if err := run(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "devstack: %v\n", err)
		os.Exit(1)
	}
}

// run starts the stack and stops it on Ctrl-C or SIGTERM.
func run(cfg devstack.Config) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	s, err := devstack.Start(startCtx, cfg)
	cancel()
	if err != nil {
		return err
	}
	fmt.Printf(`
gpustore dev stack is up (logs and data in %s):
  gpustore      %s   (query API /api/v1, /ha-tracker, /metrics)
  Prometheus    %s and %s   (the HA pair)
  Alertmanager  %s
  gpusim        %s   (/sd, /node/<host>/metrics)
  S3 (versitygw) %s   bucket directory %s
Ctrl-C stops everything.
`, cfg.Dir, s.URL("gpustore"), s.URL("prometheus-0"), s.URL("prometheus-1"), s.URL("alertmanager"), s.URL("gpusim"), s.URL("minio"), s.Bucket)
	<-ctx.Done()
	return s.Stop()
}
