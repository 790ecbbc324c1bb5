package guard

import "context"

// Checker decides requests. *Guard implements it; wrappers (a local fast
// path, metrics) implement it too, so callers never change.
type Checker interface {
	// CheckInto decides req and fills d, reusing d.Rules' storage. An error
	// means no decision could be made at all (never a rejection). The
	// Checker must not retain req or d after it returns: callers pool them.
	CheckInto(ctx context.Context, req *Request, d *Decision) error
}
