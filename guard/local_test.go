package guard_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// localStore is memstore with a local answer only when local is set; it
// counts the calls of each kind.
type localStore struct {
	*memstore.Store
	local        atomic.Bool
	calls, tries atomic.Int64
}

func (s *localStore) Do(ctx context.Context, op guard.Op, now int64, cs []guard.Counter, res []guard.CounterResult) (int64, error) {
	s.calls.Add(1)
	return s.Store.Do(ctx, op, now, cs, res)
}

func (s *localStore) DoLocal(op guard.Op, cs []guard.Counter, res []guard.CounterResult) (int64, bool) {
	s.tries.Add(1)
	if !s.local.Load() {
		return 0, false
	}
	t, err := s.Store.Do(context.Background(), op, 0, cs, res)
	return t, err == nil
}

// TestLocalOnly: under guard.LocalOnly the guard never calls its store's
// Do: a decision its LocalStore cannot answer locally is ErrWouldBlock,
// with nothing charged or observed; the lists and rules without counters
// still decide; a store that is not a LocalStore always blocks.
func TestLocalOnly(t *testing.T) {
	rs, err := rules.Load([]byte(`
rules:
  - {id: r, match: {endpoint: "^/limited"}, capacity: 1, rate: 1/1h}
`))
	if err != nil {
		t.Fatal(err)
	}
	st := &localStore{Store: memstore.New()}
	rec := &recorder{}
	g, err := guard.New(st, []byte("local-only-test-secret"), rs, guard.WithObserver(rec))
	if err != nil {
		t.Fatal(err)
	}
	local := guard.LocalOnly(context.Background())
	one := func(ctx context.Context, path string) (*guard.Decision, error) {
		d := new(guard.Decision)
		return d, g.CheckMany(ctx, []*guard.Request{{Key: "k", Path: path}}, []*guard.Decision{d})
	}
	for _, tc := range []struct {
		name          string
		ctx           context.Context
		path          string
		local         bool
		err           error
		status        int
		calls, tries  int64
		observedAfter int
	}{
		{"counter, no local answer", local, "/limited", false, guard.ErrWouldBlock, 0, 0, 1, 0},
		{"no rule applies", local, "/free", false, nil, 200, 0, 1, 1},
		{"counter, from the store", context.Background(), "/limited", false, nil, 200, 1, 1, 2},
		{"counter, local answer", local, "/limited", true, nil, 429, 1, 2, 3},
	} {
		st.local.Store(tc.local)
		d, err := one(tc.ctx, tc.path)
		if !errors.Is(err, tc.err) || (err == nil && d.Status != tc.status) {
			t.Errorf("%s: %v status %d, want %v %d", tc.name, err, d.Status, tc.err, tc.status)
		}
		if c, tr := st.calls.Load(), st.tries.Load(); c != tc.calls || tr != tc.tries {
			t.Errorf("%s: store calls %d, local tries %d; want %d, %d", tc.name, c, tr, tc.calls, tc.tries)
		}
		if n := len(rec.seen); n != tc.observedAfter {
			t.Errorf("%s: %d decisions observed, want %d: %q", tc.name, n, tc.observedAfter, rec.seen)
		}
	}
	// Peek and single checks take the same way.
	st.local.Store(false)
	if _, err := g.Peek(local, &guard.Request{Key: "k2", Path: "/limited"}); !errors.Is(err, guard.ErrWouldBlock) {
		t.Errorf("Peek: %v, want ErrWouldBlock", err)
	}
	var d guard.Decision
	if err := g.CheckInto(local, &guard.Request{Key: "k2", Path: "/limited"}, &d); !errors.Is(err, guard.ErrWouldBlock) {
		t.Errorf("CheckInto: %v, want ErrWouldBlock", err)
	}

	// A plain store has no local answers.
	plain, err := guard.New(memstore.New(), []byte("local-only-test-secret"), rs)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.CheckInto(local, &guard.Request{Key: "k", Path: "/limited"}, &d); !errors.Is(err, guard.ErrWouldBlock) {
		t.Errorf("plain store: %v, want ErrWouldBlock", err)
	}
	if fmt.Sprint(rec.seen) == "" {
		t.Fatal("nothing observed")
	}
}
