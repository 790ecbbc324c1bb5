// Package checker judges a chaos soak's history (package history) against
// Tollgate's five invariants under faults (docs/reliability.md): strict
// rules never over-admit beyond what the fault schedule allows, fast-path
// rules stay within their lease bound, usage reports equal what clients
// saw up to the counted losses, everything recovers, and no process exits
// unplanned.
//
// It is written apart from the code under test: it imports nothing of
// guard (its algorithms, memstore or Lua scripts) and reads nothing but
// the history. Its model of each algorithm is what the algorithm may
// admit at most — per aligned window, per span of the window, or limit +
// rate × span — and an admission counts in a window or span only when the
// times its client saw put it surely there, so uncertainty never turns
// into a false violation. The allowances (fail-open windows, lost Redis
// data, resets, quota grants, limit changes, the local fast path's lease
// bound) are computed here from the faults and operator changes in the
// history and the bounds in its Meta.
package checker

import (
	"cmp"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// Invariant numbers.
const (
	Strict = iota + 1
	FastPath
	Usage
	Liveness
	Exits
)

// names of the invariants, by number.
var names = [...]string{
	Strict:   "strict rules never over-admit",
	FastPath: "fast-path rules stay within their lease bound",
	Usage:    "usage equals what clients saw, losses counted",
	Liveness: "everything recovers and the last change reaches every gateway",
	Exits:    "no process exits unplanned",
}

// maxSamples bounds the violations a verdict lists.
const maxSamples = 12

// Verdict is the outcome of one invariant.
type Verdict struct {
	Number int    `json:"number"`
	Name   string `json:"name"`
	Held   bool   `json:"held"`
	// Checked says what was checked ("60 counters, 41,233 admissions").
	Checked string `json:"checked"`
	// Violations counts them; Samples describes the first few.
	Violations int      `json:"violations"`
	Samples    []string `json:"samples,omitempty"`
	// Notes are facts worth knowing that are not violations.
	Notes []string `json:"notes,omitempty"`
}

func (v *Verdict) violate(format string, args ...any) {
	v.Violations++
	if len(v.Samples) < maxSamples {
		v.Samples = append(v.Samples, fmt.Sprintf(format, args...))
	}
}

func (v *Verdict) note(format string, args ...any) {
	v.Notes = append(v.Notes, fmt.Sprintf(format, args...))
}

// Figures are the run's measurements.
type Figures struct {
	// Requests counts every request; Answered those with an answer.
	Requests      int64 `json:"requests"`
	Answered      int64 `json:"answered"`
	Allowed       int64 `json:"allowed"`
	Rejected      int64 `json:"rejected"`
	Indeterminate int64 `json:"indeterminate"`
	// AnswersPerSecond over the fault phase.
	AnswersPerSecond float64 `json:"answers_per_second"`
	// InDeadline is the share of requests answered within the client's
	// deadline, among those sent to a gateway that was not paused, down
	// or recovering; InDeadlineOf is that number of requests.
	InDeadline   float64 `json:"in_deadline"`
	InDeadlineOf int64   `json:"in_deadline_of"`
	// Degraded counts degraded answers; DegradedOutside those outside
	// every fail-open window of the schedule, DegradedStalled those of
	// them during or just after a stall of the machine.
	Degraded        int64 `json:"degraded"`
	DegradedOutside int64 `json:"degraded_outside"`
	DegradedStalled int64 `json:"degraded_stalled"`
	// Stalls counts the machine's stalls, StalledSeconds their length.
	Stalls         int     `json:"stalls"`
	StalledSeconds float64 `json:"stalled_seconds"`
	// Recovery per fault kind, in seconds.
	Recovery map[string]RecoveryFigure `json:"recovery"`
	Faults   int                       `json:"faults"`
	// Propagation of the last operator change, slowest gateway, seconds.
	Propagation float64 `json:"propagation"`
}

// RecoveryFigure summarizes the recovery times of one fault kind.
type RecoveryFigure struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	Max    float64 `json:"max"`
	Failed int     `json:"failed"`
}

// Result is the checker's judgement.
type Result struct {
	Verdicts []Verdict `json:"verdicts"`
	Figures  Figures   `json:"figures"`
}

// Held counts the invariants that held.
func (r *Result) Held() int {
	n := 0
	for _, v := range r.Verdicts {
		if v.Held {
			n++
		}
	}
	return n
}

// Check judges h.
func Check(h *history.History) *Result {
	c := &run{h: h, fx: newEffects(h), keys: map[string]*history.Key{}, rules: map[string]*history.Rule{}}
	for i := range h.Keys {
		c.keys[h.Keys[i].Name] = &h.Keys[i]
	}
	for i := range h.Rules {
		c.rules[h.Rules[i].ID] = &h.Rules[i]
	}
	res := &Result{}
	for n := Strict; n <= Exits; n++ {
		res.Verdicts = append(res.Verdicts, Verdict{Number: n, Name: names[n]})
	}
	c.limits(&res.Verdicts[Strict-1], &res.Verdicts[FastPath-1])
	c.usage(&res.Verdicts[Usage-1])
	c.liveness(&res.Verdicts[Liveness-1])
	c.exits(&res.Verdicts[Exits-1])
	for i := range res.Verdicts {
		res.Verdicts[i].Held = res.Verdicts[i].Violations == 0
	}
	res.Figures = c.figures()
	if h.Meta.Interrupted {
		for i := range res.Verdicts {
			res.Verdicts[i].note("the run was interrupted: the history is incomplete")
		}
	}
	return res
}

type run struct {
	h     *history.History
	fx    *effects
	keys  map[string]*history.Key
	rules map[string]*history.Rule
}

// counterID names a counter: rule and scope value.
type counterID struct{ rule, scope string }

func (id counterID) String() string { return id.rule + "|" + id.scope }

// counter gathers a counter's admissions: those counted against the
// limit, and the degraded admissions of a fail-closed rule, per gateway.
type counter struct {
	id     counterID
	rule   *history.Rule
	key    string // the key of a key-scope counter
	adms   []admission
	closed map[int][]admission
}

// matching returns the rules an endpoint's requests apply.
func (c *run) matching(endpoint string) []*history.Rule {
	var out []*history.Rule
	for i := range c.h.Rules {
		if slices.Contains(c.h.Rules[i].Endpoints, endpoint) {
			out = append(out, &c.h.Rules[i])
		}
	}
	return out
}

// limits checks invariants 1 and 2.
func (c *run) limits(strict, fast *Verdict) {
	counters := map[counterID]*counter{}
	var order []counterID
	var nStrict, nFast, admitted, excused, outside int64
	for i := range c.h.Answers {
		a := &c.h.Answers[i]
		if !a.Allowed() || a.Cost == 0 {
			continue
		}
		k := c.keys[a.Key]
		if k == nil {
			strict.violate("answer for unknown key %q", a.Key)
			continue
		}
		for _, r := range c.matching(a.Endpoint) {
			id := counterID{r.ID, k.Name}
			if r.Scope == "tenant" {
				id.scope = "tenant:" + k.Tenant
			}
			ct := counters[id]
			if ct == nil {
				ct = &counter{id: id, rule: r, closed: map[int][]admission{}}
				if r.Scope != "tenant" {
					ct.key = k.Name
				}
				counters[id] = ct
				order = append(order, id)
			}
			adm := admission{lo: a.Sent, hi: a.Recv, cost: a.Cost}
			admitted++
			switch {
			case a.Degraded && r.OnFailure == "closed":
				ct.closed[a.Gateway] = append(ct.closed[a.Gateway], adm)
			case a.Degraded && c.fx.inFailOpen(a.Gateway, a.Sent, a.Recv):
				excused++
			case a.Degraded:
				// Redis past its deadline with no fault of the
				// schedule: the machine's own load. Excused as the
				// contract allows, counted, and bounded by the
				// liveness invariant.
				outside++
			default:
				ct.adms = append(ct.adms, adm)
			}
		}
	}
	slices.SortFunc(order, func(a, b counterID) int { return strings.Compare(a.String(), b.String()) })
	for _, id := range order {
		ct := counters[id]
		v := strict
		if !ct.rule.Strict {
			v = fast
			nFast++
		} else {
			nStrict++
		}
		m := c.model(ct, false, 0)
		vs, total := m.check(ct.adms, 2)
		for _, x := range vs {
			v.violate("%s: %s", id, x)
		}
		if total > len(vs) {
			v.Violations += total - len(vs)
		}
		for _, gw := range slices.Sorted(maps.Keys(ct.closed)) {
			lm := c.model(ct, true, gw)
			vs, total := lm.check(ct.closed[gw], 2)
			for _, x := range vs {
				v.violate("%s on gw%d while degraded (local limiter): %s", id, gw, x)
			}
			if total > len(vs) {
				v.Violations += total - len(vs)
			}
		}
	}
	strict.Checked = fmt.Sprintf("%d strict counters", nStrict)
	fast.Checked = fmt.Sprintf("%d fast-path counters", nFast)
	for _, v := range []*Verdict{strict, fast} {
		v.note("%d admissions in all; %d degraded admissions of on_failure: open rules excused in the schedule's fail-open windows, %d outside them (Redis past its deadline without a fault: see invariant 4)", admitted, excused, outside)
	}
}

// model builds what counter ct is held to: its rule's versions over time
// (scaled by the key's overrides), and its grants. local: the gateway's
// local limiter while degraded (limit and rate × failure_share, a fresh
// limiter at each fail-open window and restart of gw).
func (c *run) model(ct *counter, local bool, gw int) *model {
	m := c.h.Meta
	r := ct.rule
	mod := &model{algorithm: r.Algorithm, window: r.Window, precision: r.Precision, maxTTL: m.MaxLeaseTTL}
	if !r.Strict && !local {
		mod.slackShare = m.LeaseShare
	}
	versions := c.versions(r)
	factors := c.factors(ct.key)
	for _, v := range versions {
		for _, f := range factors {
			iv := interval{max(v.iv.From, f.iv.From), min(v.iv.To, f.iv.To)}
			if iv.From > iv.To {
				continue
			}
			p := param{iv: iv, limit: v.limit * f.limit, rate: v.rate * f.limit}
			if local {
				p.limit = math.Max(1, math.Floor(p.limit*m.FailureShare))
				p.rate *= m.FailureShare
			}
			mod.params = append(mod.params, p)
		}
	}
	if local {
		// The local limiter lives as long as the gateway process: one
		// more local limit for each restart within the span.
		for _, t := range c.fx.restarts[gw] {
			mod.grants = append(mod.grants, grant{iv: interval{t, t}, limits: 1})
		}
	} else {
		for _, iv := range c.fx.dataLoss {
			mod.grants = append(mod.grants, grant{iv: iv, limits: 1, rateFor: m.SplitBound})
		}
		for i := range c.h.Ops {
			o := &c.h.Ops[i]
			if (o.Kind != history.OpReset && o.Kind != history.OpQuota) || !c.opTouches(o, ct) || refused(o) {
				continue
			}
			g := grant{iv: c.opWindow(o), limits: 1}
			if o.Kind == history.OpQuota {
				g = grant{iv: g.iv, units: float64(o.Tokens)}
			}
			mod.grants = append(mod.grants, g)
		}
	}
	slices.SortFunc(mod.params, func(a, b param) int { return cmp.Compare(a.iv.From, b.iv.From) })
	slices.SortFunc(mod.grants, func(a, b grant) int { return cmp.Compare(a.iv.From, b.iv.From) })
	return mod
}

// refused reports whether the operator API surely did not make change o:
// it answered 4xx.
func refused(o *history.Op) bool { return o.Status >= 400 && o.Status < 500 }

// opWindow is when change o may have happened: from its send to its
// answer, or, unanswered, until well after (an aggregator that was paused
// may carry it out when it resumes).
func (c *run) opWindow(o *history.Op) interval {
	if o.Status != 0 && o.Done != 0 {
		return interval{o.At, o.Done}
	}
	return interval{o.At, o.At + 30e6}
}

// opTouches reports whether a reset or quota grant o reaches counter ct:
// the key's requests to the endpoint apply ct's rule.
func (c *run) opTouches(o *history.Op, ct *counter) bool {
	k := c.keys[o.Key]
	if k == nil || !slices.Contains(ct.rule.Endpoints, o.Endpoint) {
		return false
	}
	if ct.rule.Scope == "tenant" {
		return ct.id.scope == "tenant:"+k.Tenant
	}
	return ct.key == k.Name
}

// versions returns the limit and rate of rule r over time: the rule as
// started, then each change of it the operator API may have made, each in
// force from its send until the next accepted change is surely known to
// every gateway.
func (c *run) versions(r *history.Rule) []param {
	type change struct {
		at, done history.Micros
		limit    int64
		ok       bool
	}
	var changes []change
	for i := range c.h.Ops {
		o := &c.h.Ops[i]
		if o.Kind != history.OpRules || o.Rule != r.ID || refused(o) {
			continue
		}
		w := c.opWindow(o)
		changes = append(changes, change{at: o.At, done: w.To, limit: o.Limit, ok: o.Succeeded()})
	}
	rateOf := func(limit int64) float64 {
		if r.Limit == 0 {
			return r.Rate
		}
		return r.Rate * float64(limit) / float64(r.Limit)
	}
	// endAfter is when the version that started at index i (-1: the
	// rule as started) is surely gone: the next accepted change known
	// everywhere.
	endAfter := func(i int) history.Micros {
		for j := i + 1; j < len(changes); j++ {
			if changes[j].ok {
				return c.fx.extendPastNATS(changes[j].done, c.h.Meta.Propagation)
			}
		}
		return forever
	}
	out := []param{{iv: interval{-forever, endAfter(-1)}, limit: float64(r.Limit), rate: r.Rate}}
	for i, ch := range changes {
		out = append(out, param{iv: interval{ch.at, endAfter(i)}, limit: float64(ch.limit), rate: rateOf(ch.limit)})
	}
	return out
}

// factors returns the override factor of key over time (1 without one;
// param.limit holds the factor), each in force from its send until its
// removal or expiry is surely known everywhere. A key-scope counter only:
// other scopes get factor 1.
func (c *run) factors(key string) []param {
	out := []param{{iv: interval{-forever, forever}, limit: 1, rate: 1}}
	if key == "" {
		return out
	}
	prop := c.h.Meta.Propagation
	for i := range c.h.Ops {
		o := &c.h.Ops[i]
		if o.Kind != history.OpOverride || o.Key != key || refused(o) || o.Factor <= 1 {
			continue
		}
		w := c.opWindow(o)
		end := c.fx.extendPastNATS(w.To+o.TTL, prop)
		for j := i + 1; j < len(c.h.Ops); j++ {
			n := &c.h.Ops[j]
			if n.Kind == history.OpUnrideKey && n.Key == key && n.Succeeded() {
				end = min(end, c.fx.extendPastNATS(n.Done, prop))
				break
			}
		}
		out = append(out, param{iv: interval{o.At, end}, limit: o.Factor, rate: o.Factor})
	}
	return out
}

// usage checks invariant 3.
func (c *run) usage(v *Verdict) {
	type tally struct{ allowed, rejected, unknown int64 }
	seen := map[string]*tally{}
	var tenants []string
	for i := range c.h.Answers {
		a := &c.h.Answers[i]
		k := c.keys[a.Key]
		if k == nil || a.Cost == 0 { // cost 0: a peek, never recorded
			continue
		}
		t := seen[k.Tenant]
		if t == nil {
			t = &tally{}
			seen[k.Tenant] = t
			tenants = append(tenants, k.Tenant)
		}
		switch {
		case a.Allowed():
			t.allowed++
		case a.Decided():
			t.rejected++
		case a.Indeterminate():
			t.unknown++
		}
	}
	slices.Sort(tenants)
	if len(c.h.Usage) == 0 {
		v.violate("no usage report was read")
		return
	}
	killed := false
	for i := range c.h.Faults {
		if c.h.Faults[i].Kind == "gw-kill" && c.h.Faults[i].Start != 0 {
			killed = true
		}
	}
	M := c.h.Counts.Missing
	exact := !killed && c.h.Counts.Dropped == 0
	var first map[string]history.Totals
	for _, u := range c.h.Usage {
		if u.Err != "" {
			v.violate("aggregator %s did not answer its report: %s", u.Aggregator, u.Err)
			continue
		}
		if first == nil {
			first = u.Tenants
		} else {
			for _, t := range tenants {
				if u.Tenants[t] != first[t] {
					v.violate("aggregator %s reports tenant %s as %+v, another as %+v: every instance must answer the whole report",
						u.Aggregator, t, u.Tenants[t], first[t])
				}
			}
		}
		var lostMin, lostMax int64
		for _, t := range tenants {
			s, r := seen[t], u.Tenants[t]
			answered := s.allowed + s.rejected
			reported := r.Allowed + r.Rejected
			if r.Allowed > s.allowed+s.unknown {
				v.violate("%s: tenant %s: %d allowed reported, clients saw %d (+%d unanswered): usage doubled", u.Aggregator, t, r.Allowed, s.allowed, s.unknown)
			}
			if r.Rejected > s.rejected+s.unknown {
				v.violate("%s: tenant %s: %d rejected reported, clients saw %d (+%d unanswered): usage doubled", u.Aggregator, t, r.Rejected, s.rejected, s.unknown)
			}
			lostMin += max(0, answered-reported)
			lostMax += max(0, answered+s.unknown-reported)
			if exact && answered > reported {
				v.violate("%s: tenant %s: %d decisions reported, clients saw %d, with no gateway SIGKILLed and nothing dropped", u.Aggregator, t, reported, answered)
			}
		}
		if exact && M != 0 {
			v.violate("%d events counted missing with no gateway SIGKILLed and nothing dropped", M)
		}
		if lostMin > M && c.h.Counts.Complete {
			v.violate("%s: %d decisions clients saw are not in the report, but only %d are counted missing", u.Aggregator, lostMin, M)
		}
		if M > lostMax+c.h.Meta.MissingSlack {
			v.violate("%s: %d events counted missing, but at most %d decisions (+ slack %d) are absent from the report", u.Aggregator, M, lostMax, c.h.Meta.MissingSlack)
		}
		v.note("%s: shortfall between %d and %d decisions; %d counted missing, %d dropped by gateways", u.Aggregator, lostMin, lostMax, M, c.h.Counts.Dropped)
	}
	if !c.h.Counts.Complete {
		v.note("a missing count died with its aggregator before it was read: the lower bound was not checked")
	}
	var a, u int64
	for _, t := range tenants {
		a += seen[t].allowed + seen[t].rejected
		u += seen[t].unknown
	}
	v.Checked = fmt.Sprintf("%d tenants, %d decisions answered, %d unanswered, %d reports", len(tenants), a, u, len(c.h.Usage))
}

// liveness checks invariant 4.
func (c *run) liveness(v *Verdict) {
	m := c.h.Meta
	var rec, prop int
	for _, p := range c.h.Probes {
		switch p.What {
		case "recovery":
			rec++
			if !p.OK {
				v.violate("fault %d (%s on %s): not recovered: %s", p.Fault, p.Kind, p.Target, p.Detail)
			} else if p.Took > m.RecoveryBound {
				v.violate("fault %d (%s on %s): recovered after %s, bound %s", p.Fault, p.Kind, p.Target, fmtDur(p.Took), fmtDur(m.RecoveryBound))
			}
		case "propagation":
			prop++
			if !p.OK {
				v.violate("the last operator change (%s) never reached %s: %s", p.Measure, p.Target, p.Detail)
			} else if p.Took > m.Propagation {
				v.violate("the last operator change (%s) reached %s after %s, bound %s", p.Measure, p.Target, fmtDur(p.Took), fmtDur(m.Propagation))
			}
		case "healthz":
			if !p.OK {
				v.violate("%s, started again after fault %d (%s), never answered /healthz: %s", p.Target, p.Fault, p.Kind, p.Detail)
			} else if p.Took > m.HealthzBound {
				v.violate("%s, started again after fault %d (%s), answered /healthz only after %s, bound %s: %s",
					p.Target, p.Fault, p.Kind, fmtDur(p.Took), fmtDur(m.HealthzBound), p.Detail)
			}
		case "polite-penalty":
			if !p.OK {
				v.violate("polite key %s penalised: %s", p.Target, p.Detail)
			}
		}
	}
	if prop == 0 && !m.Interrupted {
		v.violate("the last operator change was not timed on any gateway")
	}
	for i := range c.h.Faults {
		f := &c.h.Faults[i]
		if f.Start != 0 && f.End == 0 {
			v.violate("fault %d (%s on %s) never healed", f.ID, f.Kind, f.Target)
		}
	}
	// Outside the schedule's fail-open windows a gateway decides through
	// Redis; on a loaded machine a call may miss its deadline now and
	// then, but not often.
	var answered, outside, stalled int64
	for i := range c.h.Answers {
		a := &c.h.Answers[i]
		if a.Status == 0 || a.Cost == 0 {
			continue
		}
		answered++
		if a.Degraded && !c.fx.inFailOpen(a.Gateway, a.Sent, a.Recv) {
			if c.fx.inStall(a.Sent, a.Recv) {
				stalled++
			} else {
				outside++
			}
		}
	}
	if share := c.h.Meta.MaxUnscheduledDegraded; answered > 0 && float64(outside) > share*float64(answered) {
		v.violate("%d of %d answers (%.2f%%) degraded with no fault in force and no stall of the machine, more than %.2f%%: Redis answers too slowly without a cause",
			outside, answered, 100*float64(outside)/float64(answered), 100*share)
	}
	if stalled+outside > 0 {
		v.note("%d answers degraded outside the schedule's fail-open windows: %d during or just after a stall of the machine, %d with no cause seen", stalled+outside, stalled, outside)
	}
	polite := 0
	for i := range c.h.Answers {
		a := &c.h.Answers[i]
		if k := c.keys[a.Key]; k != nil && k.Polite {
			polite++
			if a.Code == "PENALTY" || a.Code == "KEY_BLOCKED" {
				v.violate("polite key %s answered %d %s at %s on gw%d", k.Name, a.Status, a.Code, fmtTime(a.Sent), a.Gateway)
			}
		}
	}
	v.Checked = fmt.Sprintf("%d recoveries, %d gateways reached by the last change, %d polite requests", rec, prop, polite)
}

// exits checks invariant 5.
func (c *run) exits(v *Verdict) {
	n := 0
	for _, p := range c.h.Procs {
		if p.Kind != history.ProcExit {
			continue
		}
		n++
		if !p.Planned {
			v.violate("%s exited at %s without being told to: %s", p.Name, fmtTime(p.At), p.Detail)
		}
	}
	v.Checked = fmt.Sprintf("%d process exits", n)
}

// figures measures the run.
func (c *run) figures() Figures {
	m := c.h.Meta
	f := Figures{Recovery: map[string]RecoveryFigure{}}
	var inTime int64
	var faultAnswers int64
	for i := range c.h.Answers {
		a := &c.h.Answers[i]
		f.Requests++
		if a.Status != 0 {
			f.Answered++
			if a.Sent >= m.FaultStart && a.Sent < m.FaultEnd {
				faultAnswers++
			}
		}
		switch {
		case a.Allowed():
			f.Allowed++
		case a.Decided():
			f.Rejected++
		case a.Indeterminate():
			f.Indeterminate++
		}
		if a.Degraded {
			f.Degraded++
			if !c.fx.inFailOpen(a.Gateway, a.Sent, a.Recv) {
				f.DegradedOutside++
				if c.fx.inStall(a.Sent, a.Recv) {
					f.DegradedStalled++
				}
			}
		}
		if a.Sent < m.FaultStart || a.Sent >= m.FaultEnd || c.fx.gatewayWasDown(a.Gateway, a.Sent, a.Sent+m.ClientDeadline) {
			continue
		}
		f.InDeadlineOf++
		if a.Status != 0 && a.Recv-a.Sent <= m.ClientDeadline {
			inTime++
		}
	}
	if f.InDeadlineOf > 0 {
		f.InDeadline = float64(inTime) / float64(f.InDeadlineOf)
	}
	if d := m.FaultEnd - m.FaultStart; d > 0 {
		f.AnswersPerSecond = float64(faultAnswers) / (float64(d) / 1e6)
	}
	for i := range c.h.Faults {
		if c.h.Faults[i].Start != 0 {
			f.Faults++
		}
	}
	for _, st := range c.h.Stalls {
		f.Stalls++
		f.StalledSeconds += float64(st.End-st.Start) / 1e6
	}
	byKind := map[string][]float64{}
	failed := map[string]int{}
	for _, p := range c.h.Probes {
		switch p.What {
		case "recovery":
			if p.OK {
				byKind[p.Kind] = append(byKind[p.Kind], float64(p.Took)/1e6)
			} else {
				failed[p.Kind]++
			}
		case "propagation":
			f.Propagation = math.Max(f.Propagation, float64(p.Took)/1e6)
		}
	}
	for k, xs := range byKind {
		sort.Float64s(xs)
		f.Recovery[k] = RecoveryFigure{N: len(xs), Median: xs[len(xs)/2], Max: xs[len(xs)-1], Failed: failed[k]}
	}
	for k, n := range failed {
		if _, ok := byKind[k]; !ok {
			f.Recovery[k] = RecoveryFigure{Failed: n}
		}
	}
	return f
}

func fmtTime(us history.Micros) string {
	return time.UnixMicro(us).UTC().Format("15:04:05.000000")
}

func fmtDur(us history.Micros) string {
	return time.Duration(us * 1000).Round(time.Millisecond).String()
}
