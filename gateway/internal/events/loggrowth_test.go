package events

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
)

func TestLogGrowth(t *testing.T) {
	t.Parallel()
	names := []string{"a", "b"}
	for _, tc := range []struct {
		name        string
		cur, logged []uint64
		want        string // the line logged, "" for none
	}{
		{"nothing new", []uint64{3, 4}, []uint64{3, 4}, ""},
		{"growth since the last log", []uint64{5, 4}, []uint64{3, 1}, "level=ERROR msg=grew a=2 b=3"},
		{"first log", []uint64{1, 0}, []uint64{0, 0}, "level=ERROR msg=grew a=1 b=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			noTime := func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey {
					return slog.Attr{}
				}
				return a
			}
			log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{ReplaceAttr: noTime}))
			logged := logGrowth(log, slog.LevelError, "grew", names, tc.cur, tc.logged)
			if logged != (tc.want != "") {
				t.Fatalf("logGrowth = %v, want %v", logged, tc.want != "")
			}
			if got := strings.TrimSpace(out.String()); got != tc.want {
				t.Errorf("logged %q, want %q", got, tc.want)
			}
		})
	}
}
