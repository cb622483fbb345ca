// Package queryfrontend splits long /api/v1/query_range requests at UTC
// midnights, runs the pieces in parallel through the query API's own
// handler, and caches finished pieces in memory, in the spirit of the query
// frontends of Mimir and Thanos: a dashboard refreshing a 7 d or 30 d range
// recomputes only its newest minutes.
//
// The frontend is an http.Handler middleware that sits after tenant
// resolution and before the rest of the query API's chain (dedup,
// resolution, Prometheus' v1 router). Each piece is an ordinary
// query_range request with start and end rewritten; the pieces' JSON
// answers are decoded, joined and encoded again with Prometheus' own codec.
package queryfrontend

import (
	"errors"
	"flag"
	"time"

	"github.com/grafana/dskit/flagext"
	"github.com/prometheus/common/model"
)

// Config holds the frontend's knobs (YAML section query_frontend).
type Config struct {
	// SplitByDay splits range queries at UTC midnights (aligned to their
	// step) and runs the pieces in parallel. The results cache works on
	// these pieces, so with SplitByDay off the frontend is off entirely.
	SplitByDay   bool               `yaml:"split_by_day"`
	ResultsCache ResultsCacheConfig `yaml:"results_cache"`
}

// ResultsCacheConfig bounds the in-memory cache of finished pieces.
type ResultsCacheConfig struct {
	Enabled bool `yaml:"enabled"`
	// MaxSizeBytes bounds the cached answers (estimated in-memory size);
	// the least recently used day pieces go first.
	MaxSizeBytes flagext.Bytes `yaml:"max_size_bytes"`
	// MaxFreshness: steps newer than now - max(MaxFreshness, the tenant's
	// out-of-order window) are never cached, because samples for them may
	// still arrive.
	MaxFreshness model.Duration `yaml:"max_freshness"`
}

// DefaultConfig has splitting and the cache on: 256 MiB, 10 m freshness.
func DefaultConfig() Config {
	return Config{
		SplitByDay: true,
		ResultsCache: ResultsCacheConfig{
			Enabled:      true,
			MaxSizeBytes: 256 << 20,
			MaxFreshness: model.Duration(10 * time.Minute),
		},
	}
}

// RegisterFlags binds the common knobs to fs, with c's values as defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.SplitByDay, "query.split-by-day", c.SplitByDay, "Split query_range requests at UTC midnights (aligned to the step) and run the pieces in parallel within query.max-concurrency; off also turns the results cache off.")
	fs.BoolVar(&c.ResultsCache.Enabled, "query.results-cache.enabled", c.ResultsCache.Enabled, "Cache the finished day pieces of query_range answers in memory (a request's Cache-Control: no-store bypasses it).")
	fs.Var(&c.ResultsCache.MaxSizeBytes, "query.results-cache.max-size-bytes", "Memory bound of the results cache (least recently used pieces are evicted).")
	fs.Var(&c.ResultsCache.MaxFreshness, "query.results-cache.max-freshness", "Steps newer than now minus this (or minus the tenant's out-of-order window, if longer) are never cached.")
}

// Validate checks the configuration.
func (c Config) Validate() error {
	if c.ResultsCache.Enabled && c.ResultsCache.MaxSizeBytes == 0 {
		return errors.New("query_frontend.results_cache.max_size_bytes must be positive when the cache is enabled")
	}
	if c.ResultsCache.MaxFreshness < 0 {
		return errors.New("query_frontend.results_cache.max_freshness must not be negative")
	}
	return nil
}
