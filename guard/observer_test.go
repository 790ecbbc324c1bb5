package guard_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// recorder is an Observer keeping what it was told.
type recorder struct {
	mu   sync.Mutex
	seen []string
}

func (r *recorder) Decided(_ context.Context, op guard.Op, req *guard.Request, d *guard.Decision, err error, took time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, fmt.Sprintf("%s %s %d %v", op, req.Key, d.Status, err != nil))
}

// TestObserverSeesEveryDecisionOnce: every operation and every request of
// a CheckMany call reaches each observer exactly once.
func TestObserverSeesEveryDecisionOnce(t *testing.T) {
	rs, err := rules.Load([]byte("rules:\n  - {id: r, capacity: 1, rate: 1/1h}\n"))
	if err != nil {
		t.Fatal(err)
	}
	a, b := &recorder{}, &recorder{}
	g, err := guard.New(memstore.New(), []byte("observer-test-secret"), rs, guard.WithObserver(a), guard.WithObserver(b))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var d guard.Decision
	_ = g.CheckInto(ctx, &guard.Request{Key: "k1", Path: "/x"}, &d)
	_ = g.CheckInto(ctx, &guard.Request{Key: "k1", Path: "/x"}, &d)
	_, _ = g.Peek(ctx, &guard.Request{Key: "k2", Path: "/x"})
	_, _ = g.Report(ctx, &guard.Request{Key: "k3", Path: "/x", Cost: 1})
	_ = g.CheckMany(ctx, []*guard.Request{{Key: "k4", Path: "/x"}, {Key: "k5", Path: "/x"}}, []*guard.Decision{nil, nil})
	want := []string{"check k1 200 false", "check k1 429 false", "peek k2 200 false", "report k3 200 false",
		"check k4 200 false", "check k5 200 false"}
	for _, r := range []*recorder{a, b} {
		if fmt.Sprint(r.seen) != fmt.Sprint(want) {
			t.Errorf("observed %q\nwant     %q", r.seen, want)
		}
	}
}
