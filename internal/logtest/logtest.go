// Package logtest holds the tests' loggers: Recorder, a slog handler that
// keeps every record's level and message ("INFO nats-server started"), so a
// test can ask what a component logged; Warnings, which shows a test's
// warnings and errors in its output; and Verbose, silent unless asked for
// (-v or TOLLGATE_TEST_LOG).
package logtest

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"sync"
)

// Recorder is a slog.Handler enabled at every level. It is safe for
// concurrent use.
type Recorder struct {
	mu   sync.Mutex
	recs []string
}

// Logger returns a logger writing to r.
func (r *Recorder) Logger() *slog.Logger { return slog.New(r) }

// Enabled implements slog.Handler.
func (r *Recorder) Enabled(context.Context, slog.Level) bool { return true }

// WithAttrs implements slog.Handler (attributes are not kept).
func (r *Recorder) WithAttrs([]slog.Attr) slog.Handler { return r }

// WithGroup implements slog.Handler.
func (r *Recorder) WithGroup(string) slog.Handler { return r }

// Handle implements slog.Handler.
func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Level.String()+" "+rec.Message)
	return nil
}

// Has reports whether a record was exactly line ("LEVEL message").
func (r *Recorder) Has(line string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Contains(r.recs, line)
}

// Count returns how many records start with prefix.
func (r *Recorder) Count(prefix string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, l := range r.recs {
		if strings.HasPrefix(l, prefix) {
			n++
		}
	}
	return n
}
