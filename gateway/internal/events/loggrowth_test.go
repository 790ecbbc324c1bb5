package events

import (
	"bytes"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"
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

// TestCountsLoggedOncePerInterval: drops and corrections are logged with
// their growth since the last log, at most once per dropLogEvery, and not
// at all when nothing grew.
func TestCountsLoggedOncePerInterval(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		add  func(p *Producer, n uint64)
		log  func(s *sender, now time.Time)
		want string // the line logged for a growth of 2, then of 3
	}{
		{"drops", func(p *Producer, n uint64) { p.dropped[0] += n }, (*sender).logDrops,
			"level=ERROR msg=\"events: decisions dropped (see tollgate_events_dropped_total)\" spool_full=%d oversized=0 closed=0"},
		{"corrections", func(p *Producer, n uint64) { p.corrected[1] += n }, (*sender).logFixes,
			"level=WARN msg=\"events: decisions with values beyond the schema's bounds were corrected (see tollgate_events_corrected_total)\" cost=0 time=%d length=0 retry_after=0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			noTime := func(_ []string, a slog.Attr) slog.Attr {
				if a.Key == slog.TimeKey && a.Value.Kind() == slog.KindTime { // the record's time, not the field
					return slog.Attr{}
				}
				return a
			}
			p := &Producer{log: slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{ReplaceAttr: noTime}))}
			s := &sender{p: p}
			t0 := time.Unix(1_700_000_000, 0)
			var want []string
			tc.add(p, 2)
			tc.log(s, t0)
			want = append(want, fmt.Sprintf(tc.want, 2))
			tc.add(p, 3)
			tc.log(s, t0.Add(dropLogEvery/2)) // too soon: nothing
			tc.log(s, t0.Add(dropLogEvery))
			want = append(want, fmt.Sprintf(tc.want, 3))
			tc.log(s, t0.Add(3*dropLogEvery)) // nothing grew: nothing
			if got := strings.Split(strings.TrimSpace(out.String()), "\n"); !slices.Equal(got, want) {
				t.Errorf("logged\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
		})
	}
}
