package guard

import "context"

// A LocalStore is a Store that can answer some calls from local state
// alone, without waiting for anything (guard/lease: leases and the
// negative cache).
type LocalStore interface {
	Store
	// DoLocal is Do for op at the store's own clock, answered only from
	// local state; ok is false, and nothing charged, when it cannot be.
	DoLocal(op Op, counters []Counter, res []CounterResult) (now int64, ok bool)
}

type localOnlyKey struct{}

// LocalOnly returns a context under which the guard decides only what it
// can decide without waiting for its store: the lists, penalties, rules
// that need no counter, and counters its LocalStore answers locally.
// Anything else returns ErrWouldBlock, having decided, charged and told
// the observers nothing, so the caller can ask again with a context that
// may wait (a server deciding on its connection's reading goroutine hands
// only those calls on).
func LocalOnly(ctx context.Context) context.Context {
	return context.WithValue(ctx, localOnlyKey{}, true)
}

// IsLocalOnly reports whether ctx comes from LocalOnly.
func IsLocalOnly(ctx context.Context) bool { return ctx.Value(localOnlyKey{}) != nil }

// storeDo calls the store at its own clock, or only its local state under
// LocalOnly.
func (g *Guard) storeDo(ctx context.Context, op Op, counters []Counter, res []CounterResult) (int64, error) {
	if !IsLocalOnly(ctx) {
		return g.store.Do(ctx, op, 0, counters, res)
	}
	ls, ok := g.store.(LocalStore)
	if !ok {
		return 0, ErrWouldBlock
	}
	now, ok := ls.DoLocal(op, counters, res)
	if !ok {
		return 0, ErrWouldBlock
	}
	return now, nil
}
