package guard

import "context"

// State answers the state of every rule applicable to req as the counters
// are now, charging nothing, not even hypothetically (unlike Peek, whose
// figures are after a cost of 1): each rule's remaining units, reset and
// whether it could take req's cost. The operator API's GET keys/{key}.
func (g *Guard) State(ctx context.Context, req *Request) (*Decision, error) {
	d := &Decision{}
	return d, g.decide(ctx, OpState, req, d)
}
