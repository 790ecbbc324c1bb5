package logtest_test

import (
	"context"
	"log/slog"
	"testing"

	"github.com/tollgate/tollgate/internal/logtest"
)

func TestLoggerLevels(t *testing.T) {
	for _, tt := range []struct {
		name       string
		env        string
		logger     func(testing.TB) *slog.Logger
		info, warn bool
	}{
		{"Warnings", "", logtest.Warnings, false, true},
		{"Verbose with TOLLGATE_TEST_LOG", "1", logtest.Verbose, true, true},
		{"Verbose without", "", logtest.Verbose, testing.Verbose(), testing.Verbose()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv("TOLLGATE_TEST_LOG", tt.env)
			l := tt.logger(t)
			if got := l.Enabled(context.Background(), slog.LevelInfo); got != tt.info {
				t.Errorf("info enabled: %v, want %v", got, tt.info)
			}
			if got := l.Enabled(context.Background(), slog.LevelWarn); got != tt.warn {
				t.Errorf("warn enabled: %v, want %v", got, tt.warn)
			}
		})
	}
}
