package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

// TestUndoLeavesUnsentReturnsToTheCaller: when a Cluster check fails in a
// slot with an error after which nothing surely left (guard.ErrNotSent),
// the caller (guard/lease) sends the returns not marked Returned again
// itself; undo must then not give back the returns of the slots it never
// reached, or a give-back that ran but failed to answer would be followed
// by the caller's: the units given back twice. After any other error the
// caller drops those returns, so undo gives them back and marks them.
func TestUndoLeavesUnsentReturnsToTheCaller(t *testing.T) {
	t.Parallel()
	cl := redistest.StartClusterTB(t, 3)
	client, err := NewClient(Config{Mode: ModeCluster, Addrs: cl.Addrs(), Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	s := New(client, WithTimeout(time.Second), WithTTLMargin(time.Hour))
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	if err := s.Load(ctx); err != nil {
		t.Fatal(err)
	}
	const now = 1_763_000_000_000_000
	hour := rules.Params{Limit: 100, Window: 3_600_000_000}
	for _, tc := range []struct {
		name     string
		failed   error
		returned bool
	}{
		{"not sent", ErrBreakerOpen, false},
		{"outcome unknown", context.DeadlineExceeded, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := guard.Counter{Name: "ud{" + tc.name + "}k", Algorithm: rules.FixedWindow, Params: hour, Cost: 1, Lease: 10}
			res := make([]guard.CounterResult, 1)
			if _, err := s.Do(ctx, guard.OpCheck, now, []guard.Counter{key}, res); err != nil || res[0].Leased != 10 {
				t.Fatalf("lease: %v %+v", err, res[0])
			}
			ret := key
			ret.Lease, ret.Token, ret.Return = 0, res[0].Token, 10
			cs := []guard.Counter{ret}
			rs := make([]guard.CounterResult, 1)
			calls := s.Calls()
			s.undo(ctx, now, cs, rs, nil, groupBySlot(cs), tc.failed)
			if rs[0].Returned != tc.returned {
				t.Fatalf("Returned %v after a failure %v, want %v", rs[0].Returned, tc.failed, tc.returned)
			}
			state := make([]guard.CounterResult, 1)
			if _, err := s.Do(ctx, guard.OpState, now, []guard.Counter{key}, state); err != nil {
				t.Fatal(err)
			}
			want := int64(89) // the lease's 10 units still out
			if tc.returned {
				want = 99
			}
			if state[0].Remaining != want {
				t.Fatalf("remaining %d after undo (%d calls), want %d", state[0].Remaining, s.Calls()-calls, want)
			}
		})
	}
}
