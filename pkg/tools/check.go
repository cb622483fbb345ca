package tools

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/gpustore/gpustore/pkg/app"
	"github.com/gpustore/gpustore/pkg/limits"
)

func checkConfigCommand() *Command {
	return &Command{
		Name:    "config",
		Summary: "check gpustore's YAML configuration file and the limits overrides file, as gpustore would load them",
		Usage:   "[CONFIG_FILE]",
		Doc: "The configuration file is read as `gpustore --config.file` reads it: unknown keys are errors, every section is validated " +
			"(the objstore config file it names is read too). The limits overrides file (`--limits.overrides-file`, else the one the configuration names) " +
			"is read as gpustore reloads it: per tenant, unknown keys, invalid limits and relabel rules are errors, and a file with any error is refused whole " +
			"(a running gpustore keeps its previous overrides). Prints `ok` per file, or the errors; exit code 1 when any file has errors.",
		Flags: func(fs *flag.FlagSet, env *Env) func([]string) error {
			cfgFile := fs.String("config.file", "", "gpustore's YAML configuration file (or give it as the argument).")
			overrides := fs.String("limits.overrides-file", "", "Limits overrides file to check (default: the configuration's limits.overrides_file, if any).")
			return func(args []string) error {
				if len(args) > 1 {
					return usageError("unexpected argument %q", args[1])
				}
				if len(args) == 1 {
					if *cfgFile != "" {
						return usageError("give the configuration file once (--config.file or the argument)")
					}
					*cfgFile = args[0]
				}
				if *cfgFile == "" && *overrides == "" {
					return usageError("nothing to check: give a configuration file, --limits.overrides-file, or both")
				}
				return checkConfig(env.Stdout, *cfgFile, *overrides)
			}
		},
	}
}

var errInvalidConfig = errors.New("invalid configuration")

func checkConfig(out io.Writer, cfgFile, overridesFile string) error {
	bad := 0
	defaults := app.DefaultConfig().Limits.Defaults
	if cfgFile != "" {
		fs := flag.NewFlagSet("check", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		cfg, _, err := app.Load(fs, []string{"-config.file=" + cfgFile})
		if err != nil {
			fmt.Fprintf(out, "%s: %v\n", cfgFile, err)
			bad++
		} else {
			fmt.Fprintf(out, "%s: ok\n", cfgFile)
			if overridesFile == "" {
				overridesFile = cfg.Limits.OverridesFile
			}
		}
		defaults = cfg.Limits.Defaults
	}
	if overridesFile != "" {
		f, err := os.Open(overridesFile)
		if err == nil {
			var of interface{ Tenants() int }
			of, err = limits.Load(f, defaults)
			f.Close()
			if err == nil {
				fmt.Fprintf(out, "%s: ok (%d tenants)\n", overridesFile, of.Tenants())
			}
		}
		if err != nil {
			fmt.Fprintf(out, "%s: %v\n", overridesFile, err)
			bad++
		}
	}
	if bad > 0 {
		return fmt.Errorf("%w: %d file(s) with errors", errInvalidConfig, bad)
	}
	return nil
}
