package guard

import (
	"context"
	"net/netip"
	"strconv"

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
	// OpReturn gives back Counter.Return units of the lease charged by the
	// OpCheck whose token is Counter.Token (none when the token's window
	// has passed), for a local fast path returning what it did not use.
	OpReturn
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
	case OpReturn:
		return "return"
	}
	return "unknown"
}

// Counter is one rule's counter as a Store sees it.
type Counter struct {
	// Name is the counter's storage key, given by the store's Namer (for
	// Redis: prefix, hash tag with the scope value, rule tag). A store may
	// decide counters whose names it groups together (redisstore: one
	// Cluster hash tag) atomically in one call.
	Name      string
	Algorithm rules.Algorithm
	Params    rules.Params
	Cost      int64
	Shadow    bool
	// Strict: the rule is `strict: true`; a caching store decorator
	// (guard/lease) must send the counter to the store it wraps on every
	// call, never answer it from local state.
	Strict bool
	// Token identifies an earlier charge: the one to undo (OpRefund), or
	// the lease whose units Return gives back (OpCheck, OpReturn).
	Token string
	// Lease asks OpCheck to charge up to Lease units beyond Cost when the
	// request is admitted, for a local fast path to admit later requests
	// from (guard/lease). The store grants at most a fixed share of what
	// is free after the cost, so leases shrink to nothing near the limit,
	// and never on a shadow counter nor a sliding_window_log (whose
	// charges cannot be given back in part); CounterResult.Leased says how
	// many. 0 for none.
	Lease int64
	// Return gives back, first, that many units of the lease charged with
	// Token (OpCheck, OpReturn): a local fast path returning what it did
	// not use. 0 for none.
	Return int64
	// Ledger, when not nil, asks the store to decide the counter against
	// the region's share ledger of a `regions: global` rule (the rules
	// list more than one region): the share plus the loans received less
	// the loans given, kept in the region's Redis beside the counter
	// (redisstore). A store without ledgers (memstore) decides it as any
	// counter, at Params (the region's share).
	Ledger *Ledger
}

// Ledger is what a store needs to decide a counter against the region's
// share ledger (Counter.Ledger). It is the same for every call of a
// counter under one ruleset.
type Ledger struct {
	// Region is the region's name: the ledger of counter c is kept as
	// c.Name + ":region:" + Region.
	Region string
	// Limit is the rule's whole limit (a bucket: its capacity) and Static
	// the region's static share of it.
	Limit, Static int64
	// Window is the window in µs (fixed and sliding windows) or a
	// bucket's full-refill time, rounded up to a whole µs.
	Window int64
	// Skew is the regions' clock skew bound and Period the period of
	// loans, both in µs.
	Skew, Period int64
}

// CounterID is a counter's identity: the rule's part (its tag)
// and the scope value. A Namer turns it into a Counter.Name.
type CounterID struct {
	// Rule is the rule's tag (rules.Rule.Tag): short, base64url, stable
	// across reorderings and limit changes.
	Rule string
	// Scope is the scope the counter is kept under: the rule's, except that
	// an anonymous request counts key- and tenant-scope rules per client IP
	// (ScopeIP).
	Scope rules.Scope
	// Tenant is the tenant (a key without one is its own tenant: its
	// key_id), for ScopeKey and ScopeTenant.
	Tenant string
	// KeyID is the key's key_id, for ScopeKey.
	KeyID string
	// IP is the client address, for ScopeIP: IPv4 (an IPv4-mapped address
	// unmapped), or an IPv6 address masked to its /64, by which it counts.
	// The zero Addr for a request without one.
	IP netip.Addr
	// Endpoint is the normalised endpoint of a by_endpoint rule, else "".
	Endpoint string
}

// Namer names counters. A Store that implements it names the counters the
// guard sends it (redisstore: Cluster hash tags, docs/guard.md); a
// store decorator forwards to the store it wraps. For a store that does
// not, the guard uses PlainName. A name must be a pure function of the
// identity, and distinct identities must get distinct names.
type Namer interface {
	CounterName(id *CounterID) string
}

// PlainName is the name of a counter in a store without a Namer: the
// identity's parts separated by '|', which none of them holds except the
// endpoint, which comes last (a tenant holding '|' is written with its
// length first).
func PlainName(id *CounterID) string {
	b := make([]byte, 0, 64)
	b = append(b, id.Rule...)
	b = append(b, '|')
	b = append(b, id.Scope...)
	b = append(b, '|')
	switch id.Scope {
	case rules.ScopeKey, rules.ScopeTenant:
		b = strconv.AppendInt(b, int64(len(id.Tenant)), 10)
		b = append(b, ':')
		b = append(b, id.Tenant...)
		if id.Scope == rules.ScopeKey {
			b = append(b, '|')
			b = append(b, id.KeyID...)
		}
	case rules.ScopeIP:
		b = id.IP.AppendTo(b)
	}
	if id.Endpoint != "" {
		b = append(b, '|')
		b = append(b, id.Endpoint...)
	}
	return string(b)
}

// CounterResult is a Store's answer for one counter. Times are microseconds
// relative to the decision's time.
type CounterResult struct {
	// Allowed: the counter could take the cost (for OpCheck/OpPeek). Shadow
	// counters report whether they would have admitted the request.
	Allowed bool
	// Charged: the call charged the counter its cost (and lease), or for
	// OpReport, OpAddQuota, OpRefund and OpReturn changed it. A check
	// that was rejected after giving back units of a lease (Return) is
	// not Charged.
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
	// Token identifies this call's charge for a later OpRefund, or the
	// lease for a later Return ("" when nothing was charged).
	Token string
	// Leased is the number of units charged beyond the cost for a lease
	// (Counter.Lease); Remaining, ResetAfter and the other figures count
	// them as consumed.
	Leased int64
	// Returned: the call gave back the counter's Counter.Return units
	// (OpCheck, OpReturn), whatever it decided. A store that decides a
	// call's counters in parts (redisstore on Cluster: slot by slot) may
	// fail after some parts ran: it still fills in the results of those,
	// so a caller that gives the units back again after an error can tell
	// those returns, which must not be sent twice, from the others.
	Returned bool
}

// Store decides counters atomically. Implementations: redisstore (the
// distributed truth) and memstore (exact in-memory reference model and
// fail-closed fallback).
type Store interface {
	// Do applies op to counters and writes one result per counter into res
	// (len(res) == len(counters)). now is the decision time in Unix
	// microseconds; 0 asks the store to use its own clock (Redis TIME). It
	// returns the time the decision was made at. The counters of one call
	// have distinct names (a store may read them all before it writes any).
	Do(ctx context.Context, op Op, now int64, counters []Counter, res []CounterResult) (int64, error)
}

// An Invalidator is a Store that keeps local state derived from the
// counters it saw (guard/lease: leases and the negative cache). The guard
// calls Invalidate after every SetRules, and a store decorator forwards
// it, so that local state never outlives the ruleset it was built under
// (local caches are dropped when the ruleset changes).
// Invalidate must not block: state that needs I/O to drop (units to give
// back to Redis) is dropped in the background.
type Invalidator interface {
	Invalidate()
}

// A Forgetter is a Store that keeps such local state and can drop that of
// named counters only (Counter.Name), after another process changed them in the
// store: reset (true: a lease of theirs vanished with them, and is dropped
// without giving its units back, which would come off the fresh counter)
// or granted quota, or a global counter's share grew with a loan (false:
// the negative cache no longer holds, and a lease is dropped, its unused
// units given back). It must not block.
type Forgetter interface {
	Forget(reset bool, names []string)
}
