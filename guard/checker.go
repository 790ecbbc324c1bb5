package guard

import (
	"context"
	"time"

	"github.com/tollgate/tollgate/guard/rules"
)

// Checker is what every surface calls: the proxy and forward-auth (through
// httpguard), the check API (single, batch, report) and Envoy RLS. *Guard
// implements it. Per-decision side effects (metrics, decision events) do
// not wrap it: they are Observers of the Guard, so they see every decision
// of every surface once.
type Checker interface {
	// CheckInto decides req and fills d, reusing d.Rules' storage. An error
	// means no decision could be made at all (never a rejection). The
	// Checker must not retain req or d after it returns: callers pool them.
	CheckInto(ctx context.Context, req *Request, d *Decision) error
	// CheckMany decides reqs together, all or nothing (Envoy RLS calls).
	CheckMany(ctx context.Context, reqs []*Request, ds []*Decision) error
	// Peek answers what a request of cost 1 would get, charging nothing.
	Peek(ctx context.Context, req *Request) (*Decision, error)
	// Report charges req.Cost after the fact.
	Report(ctx context.Context, req *Request) (*Decision, error)
	// Rules returns the ruleset in force (nil before the first).
	Rules() *rules.Ruleset
}

// Observer is told of every request the guard decided: once per request,
// whatever the surface — a Check, Peek, Report, Reset or AddQuota, and each
// request of a CheckMany call. It runs on the deciding goroutine after the
// decision, so it must be quick and never block; it must not retain req or
// d (callers pool them). err is set when no decision could be made (d then
// holds nothing useful). took is the time the guard took to decide, the
// store's round trip included.
type Observer interface {
	Decided(ctx context.Context, op Op, req *Request, d *Decision, err error, took time.Duration)
}
