// Command gpustore is a Prometheus remote-write receiver and TSDB tuned for
// GPU (DCGM) metrics. One binary runs every role (-target=all) or one role
// per process.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/signal"
	"slices"
	"syscall"

	"github.com/prometheus/prometheus/model/labels"

	"github.com/gpustore/gpustore/internal/logging"
	"github.com/gpustore/gpustore/internal/version"
	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/tools"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// subcommands are gpustore's commands other than serving, by the word that
// names them first on the command line (`gpustore <command> ...`); each
// parses the arguments after its name and returns the exit code. Any other
// first word that is not a flag is an error (exit 2, with the usage).
var subcommands = map[string]struct {
	summary string
	run     func(args []string) int
}{
	"tools": {summary: tools.Tree().Summary, run: func(args []string) int {
		return tools.Main(args, &tools.Env{Stdout: os.Stdout, Stderr: os.Stderr})
	}},
}

// run is gpustore's command line: a subcommand, or the server's flags.
func run(args []string) int {
	if len(args) > 0 {
		if cmd, ok := subcommands[args[0]]; ok {
			return cmd.run(args[1:])
		}
	}
	return serve(args)
}

// usage describes the command line: the server's flags, and the
// subcommands when there are any.
func usage(fs *flag.FlagSet) func() {
	return func() {
		w := fs.Output()
		fmt.Fprintf(w, "Usage: gpustore [flags]\n")
		names := slices.Sorted(maps.Keys(subcommands))
		for _, n := range names {
			fmt.Fprintf(w, "       gpustore %s ...\t%s\n", n, subcommands[n].summary)
		}
		fmt.Fprintf(w, "\nA Prometheus remote-write receiver and TSDB for GPU clusters.\nFlags (also settable in the YAML file given by -config.file):\n\n")
		fs.PrintDefaults()
	}
}

// serve runs the server until SIGINT or SIGTERM.
func serve(args []string) int {
	fs := flag.NewFlagSet("gpustore", flag.ContinueOnError)
	showVersion := app.BindCommandFlags(fs)
	fs.Usage = usage(fs)
	cfg, _, err := app.Load(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if errors.Is(err, app.ErrArguments) {
		fmt.Fprintln(fs.Output(), "gpustore:", err)
		fs.Usage()
		return 2
	}
	if *showVersion {
		fmt.Print(version.Print("gpustore"))
		return 0
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpustore:", err)
		return 2
	}
	logger, err := logging.New(os.Stderr, cfg.Log.Level, cfg.Log.Format)
	if err != nil {
		fmt.Fprintln(os.Stderr, "gpustore:", err)
		return 2
	}

	if err := cfg.Runtime.Apply(logger); err != nil {
		logger.Error("configure", "err", err)
		return 1
	}
	a, err := app.New(cfg, logger)
	if err != nil {
		logger.Error("configure", "err", err)
		return 1
	}
	a.RecordFlags(fs)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// SIGHUP re-reads the web config and the rule files (as POST /-/reload does); registered
	// before start-up so that an early SIGHUP does not kill the process.
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	go func() {
		for range hup {
			if err := a.Reload(); err != nil {
				logger.Error("reload failed", "err", err)
			} else {
				logger.Info("reloaded web config and rule files")
			}
		}
	}()
	logger.Info("starting gpustore", "version", version.Version, "labels", labels.ImplementationName, "target", cfg.Target, "listen", cfg.Server.ListenAddress, "data", cfg.TSDB.Dir)
	if err := a.Start(ctx); err != nil {
		logger.Error("start failed", "err", err)
		_ = a.Stop()
		return 1
	}
	logger.Info("gpustore is ready")
	if err := a.Wait(ctx); err != nil {
		logger.Error("shutdown", "err", err)
		return 1
	}
	logger.Info("gpustore stopped cleanly")
	return 0
}
