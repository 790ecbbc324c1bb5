package guard

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/rules"
)

// CheckMany decides reqs as one all-or-nothing call (an Envoy rate-limit
// request with several descriptors): the call is admitted only if
// every request is, and a rejected call charges nothing at all. ds[i]
// receives the decision of reqs[i] (reusing its Rules' storage; a nil
// ds[i] is replaced by a new Decision); len(ds) must equal len(reqs).
//
// Each request's rules, overrides, costs and counters are resolved exactly
// as CheckInto resolves them, against one ruleset. Requests rejected before
// the store (invalid key 400, blocklist or block rule 403, penalty 429,
// cost exceeding a limit 400) reject the call without a store call. Else
// the counters of all requests go to the store in one OpCheck call, so
// standalone and Sentinel Redis decide the whole call in one script (on
// Cluster the store decides slot by slot and refunds, see redisstore). Two
// requests hitting the same counter are charged once with the sum of their
// costs, and both get that counter's result; a sum exceeding the counter's
// enforced limit can never pass, so the requests sharing it get 400
// COST_EXCEEDS_LIMIT and the call is rejected. While the store is
// unavailable the call is decided as CheckInto decides one request (fail
// open, or the fallback store for `on_failure: closed` rules).
//
// When the call is admitted every ds[i].Allowed is true. When it is
// rejected none is: a request rejected on its own keeps its decision, and
// every other request gets Reason ReasonCallRejected with the Status, Code
// and RetryAfter of the call's deciding decision (see CallDeciding) and its
// own rules' figures as they are, uncharged (no figures when the call was
// rejected before the store).
//
// An error means no decision could be made (no ruleset, the store and the
// fallback failed, or mismatched arguments); ds then holds nothing useful.
func (g *Guard) CheckMany(ctx context.Context, reqs []*Request, ds []*Decision) error {
	if len(g.observers) == 0 {
		return g.checkMany(ctx, reqs, ds)
	}
	start := time.Now()
	err := g.checkMany(ctx, reqs, ds)
	if err == ErrWouldBlock {
		return err
	}
	took := time.Since(start)
	for i := range ds {
		if i < len(reqs) && reqs[i] != nil && ds[i] != nil {
			g.observe(ctx, OpCheck, reqs[i], ds[i], err, took)
		}
	}
	return err
}

func (g *Guard) checkMany(ctx context.Context, reqs []*Request, ds []*Decision) error {
	if len(ds) != len(reqs) {
		return fmt.Errorf("guard: check many: %d requests but %d decisions", len(reqs), len(ds))
	}
	for i, r := range reqs {
		if r == nil {
			return fmt.Errorf("guard: check many: request %d is nil", i)
		}
	}
	if len(reqs) == 0 {
		return nil
	}
	rs := g.rules.Load()
	if rs == nil {
		return ErrNoRules
	}
	for i := range ds {
		if ds[i] == nil {
			ds[i] = new(Decision)
		}
	}
	if len(reqs) == 1 {
		// One request is one CheckInto (Envoy calls with one descriptor,
		// the common case): no merging, and the resolution cache and the
		// pooled storage keep it free of allocations.
		return g.decideOnce(ctx, OpCheck, reqs[0], ds[0])
	}

	apps := make([][]applicable, len(reqs))
	rejected := false
	for i, req := range reqs {
		a, ok := g.resolve(rs, OpCheck, req, ds[i], nil)
		switch {
		case ok:
			apps[i] = a
		case !ds[i].Allowed:
			rejected = true
		}
	}

	// Merge the counters of all requests, one entry per counter name with
	// the summed cost. at[i][j] is the merged index of apps[i][j].
	var (
		counters []Counter
		ruleOf   []*rules.Rule
		at       = make([][]int, len(reqs))
		index    = make(map[string]int)
	)
	for i := range apps {
		if len(apps[i]) > 0 {
			at[i] = make([]int, len(apps[i]))
		}
		for j := range apps[i] {
			a := &apps[i][j]
			if k, ok := index[a.counter.Name]; ok {
				// Same name, same rule and scope value: same parameters.
				counters[k].Cost = addCost(counters[k].Cost, a.counter.Cost)
				at[i][j] = k
				continue
			}
			index[a.counter.Name] = len(counters)
			at[i][j] = len(counters)
			counters = append(counters, a.counter)
			ruleOf = append(ruleOf, a.rule)
		}
	}
	// A summed cost above an enforced limit can never pass (the requests'
	// own costs were checked by resolve).
	for i := range apps {
		for j := range apps[i] {
			c := &counters[at[i][j]]
			if !c.Shadow && c.Cost > c.Params.Limit && ds[i].Allowed {
				ds[i].Cost = c.Cost
				ds[i].RefusingRule, ds[i].RefusingLimit = apps[i][j].rule.ID, c.Params.Limit
				ds[i].Rules = ds[i].Rules[:0]
				ds[i].reject(400, apierror.CostExceedsLimit, ReasonCostExceedsLimit)
				apps[i] = nil
				rejected = true
			}
		}
	}
	if rejected {
		rejectCall(ds)
		return nil
	}
	if len(counters) == 0 {
		// Allowlisted or unmatched requests only.
		return nil
	}

	res := make([]CounterResult, len(counters))
	now, err := g.storeDo(ctx, OpCheck, counters, res)
	if err == ErrWouldBlock {
		return err
	}
	degraded := false
	if err != nil {
		g.degraded(err)
		degraded = true
		if now, err = g.degrade(ctx, OpCheck, ruleOf, counters, res); err != nil {
			return err
		}
	}
	admitted := true
	for i := range apps {
		if len(apps[i]) > 0 {
			g.finish(OpCheck, apps[i], res, at[i], now, degraded, ds[i])
		}
		admitted = admitted && ds[i].Allowed
	}
	if !admitted {
		rejectCall(ds)
	}
	return nil
}

// rejectCall refuses the requests of a rejected call that were not
// rejected themselves, with the status of the call's deciding decision.
func rejectCall(ds []*Decision) {
	k := CallDeciding(ds)
	if k < 0 || ds[k].Allowed {
		return
	}
	status, code, retry := ds[k].Status, ds[k].Code, ds[k].RetryAfter
	for _, d := range ds {
		if d.Allowed {
			d.reject(status, code, ReasonCallRejected)
			d.RetryAfter = retry
		}
	}
}

// CallDeciding returns the index of the decision that answers a call of
// several requests (CheckMany, a multi-descriptor Envoy call), whose
// headers the call's response carries: when any request was
// rejected on its own, the one with the longest RetryAfter (400 and 403
// have none), else, among the decisions with headers, the one whose
// deciding rule has the least remaining, ties to the smallest limit; the
// first on equal terms. It returns -1 when nothing was rejected and no
// decision carries headers. Decisions with Reason ReasonCallRejected never
// decide. Nil entries are skipped.
func CallDeciding(ds []*Decision) int {
	best := -1
	for i, d := range ds {
		if d == nil || d.Allowed || d.Reason == ReasonCallRejected {
			continue
		}
		if best < 0 || d.RetryAfter > ds[best].RetryAfter {
			best = i
		}
	}
	if best >= 0 {
		return best
	}
	for i, d := range ds {
		if d == nil || !d.Allowed || !d.HasHeaders() {
			continue
		}
		if best < 0 {
			best = i
			continue
		}
		r, b := d.DecidingRule(), ds[best].DecidingRule()
		if r.Remaining < b.Remaining || (r.Remaining == b.Remaining && r.Limit < b.Limit) {
			best = i
		}
	}
	return best
}

// addCost adds two non-negative costs, saturating.
func addCost(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}
