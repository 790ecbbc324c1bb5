package natsserver

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/nats-io/nats-server/v2/server"
)

// levelTrace is the slog level of nats-server's protocol traces.
const levelTrace = slog.LevelDebug - 4

// logAdapter sends nats-server's log to a *slog.Logger. Fatalf, which
// nats-server's own loggers end with os.Exit, is logged as an error and
// remembered, so run can report why a start failed; the process goes on.
type logAdapter struct {
	log *slog.Logger

	mu       sync.Mutex
	firstErr string // first Fatalf message
}

var _ server.Logger = (*logAdapter)(nil)

func (a *logAdapter) logf(level slog.Level, format string, v []any) string {
	ctx := context.Background()
	if !a.log.Enabled(ctx, level) {
		return ""
	}
	msg := fmt.Sprintf(format, v...)
	a.log.Log(ctx, level, msg, "component", "nats-server")
	return msg
}

// Noticef logs at Debug: nats-server's notices are its start-up listing
// (version, name, JetStream limits and store) and routine events, and the
// Server's own lifecycle lines carry what matters of them at Info.
func (a *logAdapter) Noticef(format string, v ...any) { a.logf(slog.LevelDebug, format, v) }
func (a *logAdapter) Warnf(format string, v ...any)   { a.logf(slog.LevelWarn, format, v) }
func (a *logAdapter) Errorf(format string, v ...any)  { a.logf(slog.LevelError, format, v) }
func (a *logAdapter) Debugf(format string, v ...any)  { a.logf(slog.LevelDebug, format, v) }
func (a *logAdapter) Tracef(format string, v ...any)  { a.logf(levelTrace, format, v) }

func (a *logAdapter) Fatalf(format string, v ...any) {
	a.logf(slog.LevelError, format, v)
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.firstErr == "" {
		a.firstErr = fmt.Sprintf(format, v...)
	}
}

// fatal returns the first Fatalf message, or "".
func (a *logAdapter) fatal() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.firstErr
}
