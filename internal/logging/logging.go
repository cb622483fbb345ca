// Package logging sets up log/slog and bridges it to the go-kit logger that
// dskit and objstore take, so every component writes one structured stream.
package logging

import (
	"fmt"
	"io"
	"log/slog"
	"strings"

	kitlog "github.com/go-kit/log"
)

// New returns a slog logger writing to w in "logfmt" or "json" at level
// (debug, info, warn, error).
func New(w io.Writer, level, format string) (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("log level %q: %w", level, err)
	}
	opts := &slog.HandlerOptions{Level: lvl}
	switch format {
	case "logfmt", "":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("log format %q: want logfmt or json", format)
}

// GoKit adapts l to go-kit's log.Logger. A "level" key (as go-kit's level
// package writes it) becomes the slog level; "msg" becomes the message.
func GoKit(l *slog.Logger) kitlog.Logger { return kitAdapter{l} }

type kitAdapter struct{ l *slog.Logger }

func (a kitAdapter) Log(keyvals ...any) error {
	lvl := slog.LevelInfo
	msg := ""
	attrs := make([]any, 0, len(keyvals))
	for i := 0; i+1 < len(keyvals); i += 2 {
		k := fmt.Sprint(keyvals[i])
		switch k {
		case "level":
			switch strings.ToLower(fmt.Sprint(keyvals[i+1])) {
			case "debug":
				lvl = slog.LevelDebug
			case "warn", "warning":
				lvl = slog.LevelWarn
			case "error":
				lvl = slog.LevelError
			}
			continue
		case "msg":
			msg = fmt.Sprint(keyvals[i+1])
			continue
		}
		attrs = append(attrs, k, keyvals[i+1])
	}
	a.l.Log(nil, lvl, msg, attrs...) //nolint:staticcheck // nil context: go-kit carries none
	return nil
}
