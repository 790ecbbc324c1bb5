// Package kafkalog adapts slog to franz-go's logger the way every Tollgate
// process wants it: franz-go's warnings and errors only (its info and debug
// lines come once per request or transaction), tagged lib=franz-go.
package kafkalog

import (
	"context"
	"log/slog"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
)

// New returns the kgo logger for log.
func New(log *slog.Logger) kgo.Logger { return kslog.New(Slog(log)) }

// Slog returns log restricted to warnings and errors, tagged lib=franz-go.
func Slog(log *slog.Logger) *slog.Logger {
	return slog.New(minLevel{h: log.Handler(), min: slog.LevelWarn}).With(slog.String("lib", "franz-go"))
}

// minLevel drops records below min.
type minLevel struct {
	h   slog.Handler
	min slog.Level
}

func (m minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= m.min && m.h.Enabled(ctx, l)
}
func (m minLevel) Handle(ctx context.Context, r slog.Record) error { return m.h.Handle(ctx, r) }
func (m minLevel) WithAttrs(a []slog.Attr) slog.Handler            { return minLevel{m.h.WithAttrs(a), m.min} }
func (m minLevel) WithGroup(n string) slog.Handler                 { return minLevel{m.h.WithGroup(n), m.min} }
