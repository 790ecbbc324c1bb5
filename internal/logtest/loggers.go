package logtest

import (
	"log/slog"
	"os"
	"testing"
)

// Warnings returns a logger writing warnings and errors into t's output,
// so a failing test shows what went wrong and a passing one stays quiet.
func Warnings(t testing.TB) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// Verbose returns a logger that discards everything unless the tests run
// with -v or TOLLGATE_TEST_LOG is set; then it writes from info up to
// stderr, each record naming t's test. It suits components whose logs are
// long and whose failures the test reports itself.
func Verbose(t testing.TB) *slog.Logger {
	if testing.Verbose() || os.Getenv("TOLLGATE_TEST_LOG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}
