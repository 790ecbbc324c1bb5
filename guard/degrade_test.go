package guard_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
)

// flakyStore is a memstore that fails while down is set, counting the
// calls it answers and the units it charges.
type flakyStore struct {
	s       *memstore.Store
	down    atomic.Bool
	err     error
	calls   atomic.Int64
	charged atomic.Int64
}

func (f *flakyStore) Do(ctx context.Context, op guard.Op, now int64, cs []guard.Counter, res []guard.CounterResult) (int64, error) {
	if f.down.Load() {
		return 0, f.err
	}
	f.calls.Add(1)
	t, err := f.s.Do(ctx, op, now, cs, res)
	for i := range res {
		if res[i].Charged && op == guard.OpCheck {
			f.charged.Add(cs[i].Cost)
		}
	}
	return t, err
}

// countHandler counts log records by level.
type countHandler struct {
	mu    sync.Mutex
	warns int
	last  []slog.Attr
}

func (h *countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.Level == slog.LevelWarn {
		h.warns++
		h.last = h.last[:0]
		r.Attrs(func(a slog.Attr) bool { h.last = append(h.last, a); return true })
	}
	return nil
}
func (h *countHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countHandler) WithGroup(string) slog.Handler      { return h }

const degradeRules = `
rules:
  - id: open
    match: {}
    algorithm: fixed_window
    limit: 1000000
    window: 1h
  - id: closed
    match: {endpoint: "^/strict"}
    on_failure: closed
    algorithm: fixed_window
    limit: 8
    window: 1h
`

// TestDegradedAdmissionsNeverCharged: checks decided while the store fails
// are answered (fail open, or locally for closed rules), counted by the
// hook, logged at most once a second, and never sent to the store once it
// is back: the store's counters hold exactly the admissions it decided.
func TestDegradedAdmissionsNeverCharged(t *testing.T) {
	t.Parallel()
	storeErr := errors.New("redis: i/o timeout")
	st := &flakyStore{s: memstore.New(), err: storeErr}
	var hook atomic.Int64
	var lastErr atomic.Value
	logs := &countHandler{}
	g := mustGuard(t, st, mustRules(t, degradeRules),
		guard.WithFallback(memstore.New(), 0.25),
		guard.WithLogger(slog.New(logs)),
		guard.WithOnDegraded(func(err error) { hook.Add(1); lastErr.Store(err) }))
	ctx := context.Background()

	var normal, degraded int64
	check := func(path string) *guard.Decision {
		t.Helper()
		d, err := g.Check(ctx, &guard.Request{Key: "k", Path: path})
		if err != nil {
			t.Fatal(err)
		}
		if d.Degraded {
			degraded++
		} else if d.Allowed {
			normal++
		}
		return d
	}
	for range 50 {
		check("/")
	}
	st.down.Store(true)
	strictAllowed := 0
	for i := range 300 {
		path := "/"
		if i%3 == 0 {
			path = "/strict"
		}
		d := check(path)
		if !d.Degraded || d.Reason != guard.ReasonRedisUnavailable && d.Allowed {
			t.Fatalf("check %d during the outage: %+v", i, d)
		}
		for _, rr := range d.Rules {
			switch rr.ID {
			case "open":
				if !rr.FailOpen || rr.Remaining != -1 || !rr.Allowed {
					t.Fatalf("fail-open rule: %+v", rr)
				}
			case "closed":
				if rr.FailOpen || rr.Limit != 8 {
					t.Fatalf("fail-closed rule: %+v", rr)
				}
			}
		}
		if path == "/strict" && d.Allowed {
			strictAllowed++
		}
	}
	// limit 8 × share 0.25: 2 per window, decided locally.
	if strictAllowed != 2 {
		t.Fatalf("fail-closed rule admitted %d during the outage, want 2", strictAllowed)
	}
	st.down.Store(false)
	for range 50 {
		check("/")
	}
	if degraded != 300 || hook.Load() != 300 || !errors.Is(lastErr.Load().(error), storeErr) {
		t.Fatalf("degraded %d, hook %d (%v), want 300", degraded, hook.Load(), lastErr.Load())
	}
	if st.calls.Load() != 100 || st.charged.Load() != normal || normal != 100 {
		t.Fatalf("store answered %d calls and charged %d, normal admissions %d; want 100 each",
			st.calls.Load(), st.charged.Load(), normal)
	}
	logs.mu.Lock()
	defer logs.mu.Unlock()
	if logs.warns != 1 {
		t.Fatalf("%d warnings for 300 degraded decisions within a second, want 1", logs.warns)
	}
}

// TestFallbackBoundedUnderKeyFlood: a flood of distinct keys against an
// `on_failure: closed` rule while the store is down keeps the fallback
// within its bound, and every check is still answered.
func TestFallbackBoundedUnderKeyFlood(t *testing.T) {
	t.Parallel()
	const bound = 1000
	fb := memstore.New(memstore.WithMaxCounters(bound))
	st := &flakyStore{s: memstore.New(), err: guard.ErrUnavailable}
	st.down.Store(true)
	g := mustGuard(t, st, mustRules(t, degradeRules), guard.WithFallback(fb, 0.25))
	ctx := context.Background()
	maxLen := 0
	for i := range 20 * bound {
		d, err := g.Check(ctx, &guard.Request{Key: fmt.Sprintf("flood-%d", i), Path: "/strict"})
		if err != nil {
			t.Fatal(err)
		}
		if !d.Allowed || !d.Degraded {
			t.Fatalf("key %d: first request of a new key: %+v", i, d)
		}
		if i%97 == 0 {
			maxLen = max(maxLen, fb.Len())
		}
	}
	if n := fb.Len(); n > bound || maxLen > bound {
		t.Fatalf("fallback holds %d counters (max seen %d), bound %d", n, maxLen, bound)
	}
}

// TestCheckManyDegrades: a multi-descriptor call is decided degraded like
// one request, and the hook counts the call once.
func TestCheckManyDegrades(t *testing.T) {
	t.Parallel()
	st := &flakyStore{s: memstore.New(), err: guard.ErrUnavailable}
	st.down.Store(true)
	var hook atomic.Int64
	g := mustGuard(t, st, mustRules(t, degradeRules), guard.WithFallback(memstore.New(), 0.25),
		guard.WithOnDegraded(func(error) { hook.Add(1) }))
	reqs := []*guard.Request{{Key: "a", Path: "/"}, {Key: "b", Path: "/"}}
	ds := make([]*guard.Decision, 2)
	if err := g.CheckMany(context.Background(), reqs, ds); err != nil {
		t.Fatal(err)
	}
	for i, d := range ds {
		if !d.Allowed || !d.Degraded || d.Reason != guard.ReasonRedisUnavailable {
			t.Fatalf("decision %d: %+v", i, d)
		}
	}
	if hook.Load() != 1 {
		t.Fatalf("hook called %d times, want 1", hook.Load())
	}
}

// BenchmarkCheckDegraded: a check answered while the store refuses at once
// (an open circuit breaker): fail-open, and fail-closed through the
// fallback.
func BenchmarkCheckDegraded(b *testing.B) {
	for _, path := range []string{"/", "/strict"} {
		b.Run("path="+path, func(b *testing.B) {
			st := &flakyStore{s: memstore.New(), err: guard.ErrUnavailable}
			st.down.Store(true)
			g := mustGuard(b, st, mustRules(b, degradeRules), guard.WithFallback(memstore.New(), 0.25))
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				req := &guard.Request{Key: "k", Path: path}
				d := &guard.Decision{}
				for pb.Next() {
					if err := g.CheckInto(context.Background(), req, d); err != nil || !d.Degraded {
						b.Fatal(err, d.Degraded)
					}
				}
			})
		})
	}
}
