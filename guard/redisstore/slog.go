package redisstore

import (
	"context"
	"fmt"
	"log/slog"
)

// SlogLogger adapts slog to go-redis's process-wide logger, at debug level
// (the store counts and reports failures itself): a binary calls
// redis.SetLogger(redisstore.SlogLogger{Log: log}) once in main, so a
// failed dial never prints on its own line outside the structured log.
type SlogLogger struct{ Log *slog.Logger }

// Printf implements go-redis's logger.
func (l SlogLogger) Printf(ctx context.Context, format string, v ...any) {
	l.Log.DebugContext(ctx, fmt.Sprintf(format, v...), slog.String("lib", "go-redis"))
}
