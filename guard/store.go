package guard

import (
	"context"

	"github.com/tollgate/tollgate/guard/rules"
)

// Op is what a Store call does to its counters.
type Op uint8

// Store operations.
const (
	// OpCheck admits the request when every enforced counter can take its
	// cost, and then charges them all; otherwise it charges nothing. Shadow
	// counters are charged only when the request is admitted and they would
	// have admitted it too.
	OpCheck Op = iota + 1
	// OpPeek answers what OpCheck would and changes nothing.
	OpPeek
	// OpReport charges every counter its cost unconditionally (after the
	// fact), letting a counter fall into debt of at most one full limit.
	OpReport
	// OpReset deletes the counters: they start full.
	OpReset
	// OpAddQuota gives Cost units back to every counter (never above full).
	OpAddQuota
	// OpRefund undoes an earlier OpCheck charge identified by Counter.Token.
	OpRefund
	// OpState reports each counter's state and whether it could take its
	// cost, as the counters are now: nothing is charged, not even
	// hypothetically (unlike OpPeek, whose figures are after the cost).
	OpState
)

func (o Op) String() string {
	switch o {
	case OpCheck:
		return "check"
	case OpPeek:
		return "peek"
	case OpReport:
		return "report"
	case OpReset:
		return "reset"
	case OpAddQuota:
		return "add_quota"
	case OpRefund:
		return "refund"
	case OpState:
		return "state"
	}
	return "unknown"
}

// Counter is one rule's counter as a Store sees it.
type Counter struct {
	// Name is the counter's storage key (for Redis: prefix, hash tag with the
	// scope value, rule tag; see Namer). Counters sharing a hash tag are
	// decided atomically together.
	Name      string
	Algorithm rules.Algorithm
	Params    rules.Params
	Cost      int64
	Shadow    bool
	// Token identifies an earlier charge to undo (OpRefund only).
	Token string
}

// CounterResult is a Store's answer for one counter. Times are microseconds
// relative to the decision's time.
type CounterResult struct {
	// Allowed: the counter could take the cost (for OpCheck/OpPeek). Shadow
	// counters report whether they would have admitted the request.
	Allowed bool
	// Charged: the counter's state was changed by the call.
	Charged bool
	// Remaining is the floor of the units available after the call; it may
	// be negative when a counter is in debt.
	Remaining int64
	// ResetAfter is the time until the counter is full again if nothing more
	// is charged.
	ResetAfter int64
	// NextAfter is the time until at least one more unit is available than
	// now (0 when the counter is full).
	NextAfter int64
	// RetryAfter is the time until the cost would be admitted (0 when it is
	// admitted now).
	RetryAfter int64
	// Token identifies this call's charge for a later OpRefund ("" when
	// nothing was charged).
	Token string
}

// Store decides counters atomically. Implementations: redisstore (the
// distributed truth) and memstore (exact in-memory reference model and
// fail-closed fallback).
type Store interface {
	// Do applies op to counters and writes one result per counter into res
	// (len(res) == len(counters)). now is the decision time in Unix
	// microseconds; 0 asks the store to use its own clock (Redis TIME). It
	// returns the time the decision was made at.
	Do(ctx context.Context, op Op, now int64, counters []Counter, res []CounterResult) (int64, error)
}
