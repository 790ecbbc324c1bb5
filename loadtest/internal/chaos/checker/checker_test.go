package checker

import (
	"bytes"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// t0 is a time aligned to every window the tests use.
const t0 = history.Micros(1_700_000_000_000_000)

const sec = history.Micros(1_000_000)

// base returns a history of one gateway-fleet run with one rule per
// algorithm on its own endpoint, and two tenants' keys.
func base() *history.History {
	return &history.History{
		Meta: history.Meta{Gateways: 3, Aggregators: 2, FailureShare: 0.25, ClientDeadline: sec,
			FailOpenTail: 10 * sec, SplitBound: 5 * sec, Propagation: 2 * sec, RecoveryBound: 60 * sec,
			LeaseShare: 0.01, MaxLeaseTTL: 10 * sec, MaxUnscheduledDegraded: 0.05, Start: t0 - 10*sec, FaultStart: t0, FaultEnd: t0 + 100*sec, End: t0 + 120*sec},
		Rules: []history.Rule{
			{ID: "fw", Algorithm: history.FixedWindow, Limit: 10, Window: 2 * sec, Strict: true, OnFailure: "open", Scope: "key", Endpoints: []string{"/fw"}},
			{ID: "fwc", Algorithm: history.FixedWindow, Limit: 8, Window: 2 * sec, Strict: true, OnFailure: "closed", Scope: "key", Endpoints: []string{"/fwc"}},
			{ID: "tb", Algorithm: history.TokenBucket, Limit: 10, Rate: 5, Strict: true, OnFailure: "open", Scope: "key", Endpoints: []string{"/tb"}},
			{ID: "ftb", Algorithm: history.TokenBucket, Limit: 200, Rate: 10, Strict: false, OnFailure: "open", Scope: "key", Endpoints: []string{"/ftb"}},
			{ID: "swl", Algorithm: history.SlidingWindowLog, Limit: 5, Window: 2 * sec, Strict: true, OnFailure: "open", Scope: "key", Endpoints: []string{"/swl"}},
			{ID: "swc", Algorithm: history.SlidingWindowCounter, Limit: 6, Window: 3 * sec, Precision: 3, Strict: true, OnFailure: "open", Scope: "key", Endpoints: []string{"/swc"}},
			{ID: "gcra", Algorithm: history.GCRA, Limit: 4, Window: 2 * sec, Rate: 2, Strict: true, OnFailure: "open", Scope: "key", Endpoints: []string{"/gcra", "/t"}},
			{ID: "ten", Algorithm: history.FixedWindow, Limit: 5, Window: 2 * sec, Strict: true, OnFailure: "open", Scope: "tenant", Endpoints: []string{"/t"}},
		},
		Keys: []history.Key{
			{Name: "a1", Raw: "sk_a1", Tenant: "a"},
			{Name: "a2", Raw: "sk_a2", Tenant: "a"},
			{Name: "b1", Raw: "sk_b1", Tenant: "b"},
			{Name: "bp", Raw: "sk_bp", Tenant: "b", Polite: true},
		},
		Usage:  []history.Usage{{Aggregator: "agg1", Tenants: map[string]history.Totals{}}},
		Counts: history.Counts{Complete: true},
		Probes: []history.Probe{{What: "propagation", Target: "gw1", Took: sec / 10, OK: true, Measure: "rules"}},
	}
}

// admit appends n answers of key to endpoint, status 200, spread evenly
// over [from, from+span), each answered 1 ms after it was sent, on gw.
func admit(h *history.History, key, endpoint string, gw int, from, span history.Micros, n int, mod ...func(*history.Answer)) {
	for i := range n {
		at := from + span*history.Micros(i)/history.Micros(n)
		a := history.Answer{Gateway: gw, Surface: history.SurfaceCheck, Key: key, Endpoint: endpoint, Cost: 1,
			Sent: at, Recv: at + 1000, Status: 200, Written: true}
		for _, f := range mod {
			f(&a)
		}
		h.Answers = append(h.Answers, a)
	}
}

// twiceTheLimit admits a1 to /fw its limit (10) twice within one 2 s
// window from t0: ten in the first half second, ten in the half second
// after t0+1s. A fault or operation between them decides whether the
// second ten are allowed.
func twiceTheLimit(h *history.History) {
	admit(h, "a1", "/fw", 1, t0, sec/2-2000, 10)
	admit(h, "a1", "/fw", 1, t0+sec, sec/2, 10)
}

func degraded(a *history.Answer) { a.Degraded = true }

// balance sets every aggregator's report to what the answers say.
func balance(h *history.History) {
	t := map[string]history.Totals{}
	tenant := map[string]string{}
	for _, k := range h.Keys {
		tenant[k.Name] = k.Tenant
	}
	for _, a := range h.Answers {
		if a.Cost == 0 {
			continue
		}
		x := t[tenant[a.Key]]
		switch {
		case a.Allowed():
			x.Allowed++
		case a.Decided():
			x.Rejected++
		}
		t[tenant[a.Key]] = x
	}
	for i := range h.Usage {
		h.Usage[i].Tenants = t
	}
}

func verdict(t *testing.T, h *history.History, n int) Verdict {
	t.Helper()
	return Check(h).Verdicts[n-1]
}

func TestLimits(t *testing.T) {
	cases := []struct {
		name string
		inv  int
		make func(h *history.History)
		held bool
		want string // in a sample when violated
	}{
		{"fixed window at its limit", Strict, func(h *history.History) {
			admit(h, "a1", "/fw", 1, t0, 2*sec-2000, 10)
			admit(h, "a1", "/fw", 2, t0+2*sec, 2*sec-2000, 10)
		}, true, ""},
		{"fixed window one over", Strict, func(h *history.History) {
			admit(h, "a1", "/fw", 1, t0, sec, 6)
			admit(h, "a1", "/fw", 2, t0+sec, sec-2000, 5)
		}, false, "fw|a1: 11 units"},
		{"straddling admissions are not counted in either window", Strict, func(h *history.History) {
			admit(h, "a1", "/fw", 1, t0, sec, 10)
			admit(h, "a1", "/fw", 1, t0+2*sec-500, 0, 1, func(a *history.Answer) { a.Recv = t0 + 2*sec + 500 })
		}, true, ""},
		{"other keys have counters of their own", Strict, func(h *history.History) {
			admit(h, "a1", "/fw", 1, t0, sec, 10)
			admit(h, "a2", "/fw", 1, t0, sec, 10)
		}, true, ""},
		{"degraded open admissions in a fail-open window are excused", Strict, func(h *history.History) {
			h.Faults = []history.Fault{{ID: 1, Kind: "redis-stop", Target: "redis-a", Start: t0, End: t0 + sec}}
			admit(h, "a1", "/fw", 1, t0, sec, 10)
			admit(h, "a1", "/fw", 1, t0+sec/2, sec/2, 30, degraded)
		}, true, ""},
		{"a gateway's own Redis link fault excuses it", Strict, func(h *history.History) {
			h.Faults = []history.Fault{{ID: 1, Kind: "link-cut", Target: "gw2", Link: &history.Link{Client: "gw2", Server: "redis"}, Start: t0, End: t0 + sec}}
			admit(h, "a1", "/fw", 2, t0, sec, 10)
			admit(h, "a1", "/fw", 2, t0+sec/2, sec/2, 30, degraded)
		}, true, ""},
		{"degraded admissions outside every window are left to the liveness bound", Strict, func(h *history.History) {
			admit(h, "a1", "/fw", 1, t0, sec, 10)
			admit(h, "a1", "/fw", 1, t0+sec, sec/2, 1, degraded)
		}, true, ""},
		{"fail-closed degraded admissions are held to the local limit", Strict, func(h *history.History) {
			h.Faults = []history.Fault{{ID: 1, Kind: "redis-kill", Target: "redis-a", Start: t0 - 10*sec, End: t0 + 10*sec}}
			admit(h, "a1", "/fwc", 1, t0+2*sec, sec, 2, degraded) // max(1, floor(8 × 0.25)) = 2
			admit(h, "a1", "/fwc", 2, t0+2*sec, sec, 2, degraded)
		}, true, ""},
		{"fail-closed degraded admissions over the local limit", Strict, func(h *history.History) {
			h.Faults = []history.Fault{{ID: 1, Kind: "redis-kill", Target: "redis-a", Start: t0 - 10*sec, End: t0 + 10*sec}}
			admit(h, "a1", "/fwc", 1, t0+2*sec, sec, 3, degraded)
		}, false, "while degraded (local limiter)"},
		{"a primary lost grants a limit more", Strict, func(h *history.History) {
			h.Faults = []history.Fault{{ID: 1, Kind: "redis-kill", Target: "redis-a", Start: t0 + sec/2, End: t0 + sec}}
			twiceTheLimit(h)
		}, true, ""},
		{"a gateway link fault grants no data loss", Strict, func(h *history.History) {
			h.Faults = []history.Fault{{ID: 1, Kind: "link-cut", Target: "gw1", Link: &history.Link{Client: "gw1", Server: "redis"}, Start: t0 + sec/2, End: t0 + sec}}
			twiceTheLimit(h)
		}, false, "fw|a1: 20 units"},
		{"an operator reset grants a limit more", Strict, func(h *history.History) {
			h.Ops = []history.Op{{Kind: history.OpReset, Key: "a1", Endpoint: "/fw", At: t0 + sec/2, Done: t0 + sec/2 + 1000, Status: 200}}
			twiceTheLimit(h)
		}, true, ""},
		{"a reset of another key grants nothing", Strict, func(h *history.History) {
			h.Ops = []history.Op{{Kind: history.OpReset, Key: "a2", Endpoint: "/fw", At: t0 + sec/2, Done: t0 + sec/2 + 1000, Status: 200}}
			twiceTheLimit(h)
		}, false, "fw|a1"},
		{"a refused reset grants nothing", Strict, func(h *history.History) {
			h.Ops = []history.Op{{Kind: history.OpReset, Key: "a1", Endpoint: "/fw", At: t0 + sec/2, Done: t0 + sec/2 + 1000, Status: 400}}
			twiceTheLimit(h)
		}, false, "fw|a1"},
		{"a quota grant grants its units", Strict, func(h *history.History) {
			h.Ops = []history.Op{{Kind: history.OpQuota, Key: "a1", Endpoint: "/fw", Tokens: 3, At: t0 + sec/2, Done: t0 + sec/2 + 1000, Status: 200}}
			admit(h, "a1", "/fw", 1, t0, sec, 13)
		}, true, ""},
		{"a limit raised by the operator", Strict, func(h *history.History) {
			h.Ops = []history.Op{{Kind: history.OpRules, Rule: "fw", Limit: 20, At: t0 - sec, Done: t0 - sec + 1000, Status: 200}}
			admit(h, "a1", "/fw", 1, t0, sec, 20)
		}, true, ""},
		{"a limit lowered by the operator: the old one holds while it propagates", Strict, func(h *history.History) {
			h.Ops = []history.Op{{Kind: history.OpRules, Rule: "fw", Limit: 4, At: t0, Done: t0 + 1000, Status: 200}}
			admit(h, "a1", "/fw", 1, t0, sec, 10)
			admit(h, "a1", "/fw", 1, t0+4*sec, sec, 5)
		}, false, "fw|a1: 5 units"},
		{"an override raises a key's limit", Strict, func(h *history.History) {
			h.Ops = []history.Op{{Kind: history.OpOverride, Key: "a1", Factor: 2, TTL: 60 * sec, At: t0 - sec, Done: t0 - sec + 1000, Status: 200}}
			admit(h, "a1", "/fw", 1, t0, sec, 20)
		}, true, ""},
		{"token bucket: burst then rate", Strict, func(h *history.History) {
			admit(h, "a1", "/tb", 1, t0, 1000, 10)
			admit(h, "a1", "/tb", 2, t0+sec, 10*sec, 50)
		}, true, ""},
		{"token bucket: a second burst too soon", Strict, func(h *history.History) {
			admit(h, "a1", "/tb", 1, t0, 1000, 10)
			admit(h, "a1", "/tb", 2, t0+sec/2, 1000, 10)
		}, false, "tb|a1"},
		{"sliding log: limit per span", Strict, func(h *history.History) {
			admit(h, "a1", "/swl", 1, t0+sec/2, sec, 5)
			admit(h, "a1", "/swl", 1, t0+sec/2+2*sec+2000, sec, 5)
		}, true, ""},
		{"sliding log: one over in a span across a window boundary", Strict, func(h *history.History) {
			admit(h, "a1", "/swl", 1, t0+sec, sec/2, 3)
			admit(h, "a1", "/swl", 1, t0+2*sec, sec/2, 3)
		}, false, "swl|a1: 6 units"},
		{"sliding window counter: limit per precision sub-windows", Strict, func(h *history.History) {
			admit(h, "a1", "/swc", 1, t0, sec-2000, 3)
			admit(h, "a1", "/swc", 1, t0+2*sec, sec-2000, 3)
			admit(h, "a1", "/swc", 1, t0+3*sec, sec-2000, 3)
		}, true, ""},
		{"sliding window counter: over in three sub-windows", Strict, func(h *history.History) {
			admit(h, "a1", "/swc", 1, t0, sec-2000, 3)
			admit(h, "a1", "/swc", 1, t0+2*sec, sec-2000, 4)
		}, false, "swc|a1: 7 units"},
		{"gcra is a bucket of its burst", Strict, func(h *history.History) {
			admit(h, "a1", "/gcra", 1, t0, 1000, 4)
			admit(h, "a1", "/gcra", 1, t0+sec, 1000, 3)
		}, false, "gcra|a1"},
		{"tenant counters add up the tenant's keys", Strict, func(h *history.History) {
			admit(h, "a1", "/t", 1, t0, sec, 3)
			admit(h, "a2", "/t", 2, t0, sec, 3)
		}, false, "ten|tenant:a: 6 units"},
		{"fast path: within the lease bound", FastPath, func(h *history.History) {
			admit(h, "a1", "/ftb", 1, t0, 1000, 201) // 1 % of 200 = 2 units of slack
		}, true, ""},
		{"fast path: beyond the lease bound", FastPath, func(h *history.History) {
			admit(h, "a1", "/ftb", 1, t0, 1000, 203)
		}, false, "ftb|a1"},
		{"peeks charge nothing", Strict, func(h *history.History) {
			admit(h, "a1", "/fw", 1, t0, sec, 10)
			admit(h, "a1", "/fw", 1, t0, sec, 10, func(a *history.Answer) { a.Cost = 0 })
		}, true, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := base()
			tc.make(h)
			balance(h)
			v := verdict(t, h, tc.inv)
			if v.Held != tc.held {
				t.Fatalf("held = %v, want %v; samples %q; notes %q", v.Held, tc.held, v.Samples, v.Notes)
			}
			if !tc.held && !strings.Contains(strings.Join(v.Samples, "\n"), tc.want) {
				t.Fatalf("samples %q, want one with %q", v.Samples, tc.want)
			}
		})
	}
}

func TestUsage(t *testing.T) {
	withAnswers := func(h *history.History) {
		admit(h, "a1", "/fw", 1, t0, sec, 10)
		admit(h, "b1", "/fw", 2, t0, sec, 8)
		admit(h, "b1", "/fw", 2, t0+sec/2, sec/2, 5, func(a *history.Answer) { a.Status = 429; a.Code = "RATE_LIMIT_EXCEEDED" })
	}
	set := func(agg, tenant string, allowed, rejected int64) func(*history.History) {
		return func(h *history.History) {
			for i := range h.Usage {
				if h.Usage[i].Aggregator == agg {
					h.Usage[i].Tenants = cloneTotals(h.Usage[i].Tenants)
					h.Usage[i].Tenants[tenant] = history.Totals{Allowed: allowed, Rejected: rejected}
				}
			}
		}
	}
	cases := []struct {
		name   string
		change []func(*history.History)
		held   bool
		want   string
	}{
		{"equal", nil, true, ""},
		{"doubled", []func(*history.History){set("agg1", "a", 20, 0)}, false, "usage doubled"},
		{"short with nothing killed", []func(*history.History){set("agg1", "a", 9, 0), func(h *history.History) { h.Counts.Missing = 1 }},
			false, "with no gateway SIGKILLed"},
		{"short after a kill, counted missing", []func(*history.History){set("agg1", "a", 9, 0), killGateway, func(h *history.History) { h.Counts.Missing = 1 }},
			true, ""},
		{"short after a kill, not counted", []func(*history.History){set("agg1", "a", 8, 0), killGateway, func(h *history.History) { h.Counts.Missing = 1 }},
			false, "only 1 are counted missing"},
		{"counted missing beyond the shortfall", []func(*history.History){killGateway, func(h *history.History) { h.Counts.Missing = 3 }},
			false, "at most 0 decisions"},
		{"unanswered requests may or may not count", []func(*history.History){unanswered(2), set("agg1", "a", 12, 0)}, true, ""},
		{"aggregators disagree", []func(*history.History){twoAggregators, set("agg2", "b", 8, 4)}, false, "every instance"},
		{"an aggregator without a report", []func(*history.History){func(h *history.History) { h.Usage[0].Err = "timeout" }}, false, "did not answer"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := base()
			withAnswers(h)
			balance(h)
			for _, f := range tc.change {
				f(h)
			}
			v := verdict(t, h, Usage)
			if v.Held != tc.held {
				t.Fatalf("held = %v, want %v; samples %q; notes %q", v.Held, tc.held, v.Samples, v.Notes)
			}
			if !tc.held && !strings.Contains(strings.Join(v.Samples, "\n"), tc.want) {
				t.Fatalf("samples %q, want one with %q", v.Samples, tc.want)
			}
		})
	}
}

func cloneTotals(m map[string]history.Totals) map[string]history.Totals {
	out := map[string]history.Totals{}
	for k, v := range m {
		out[k] = v
	}
	return out
}

func killGateway(h *history.History) {
	h.Faults = append(h.Faults, history.Fault{ID: 9, Kind: "gw-kill", Target: "gw1", Start: t0 + sec, End: t0 + 2*sec})
}

func unanswered(n int) func(*history.History) {
	return func(h *history.History) {
		admit(h, "a1", "/fw", 1, t0+5*sec, sec, n, func(a *history.Answer) { a.Status = 0; a.Err = "timeout" })
	}
}

func twoAggregators(h *history.History) {
	h.Usage = append(h.Usage, history.Usage{Aggregator: "agg2", Tenants: cloneTotals(h.Usage[0].Tenants)})
}

func TestLivenessAndExits(t *testing.T) {
	cases := []struct {
		name   string
		inv    int
		change func(*history.History)
		want   string
	}{
		{"not recovered", Liveness, func(h *history.History) {
			h.Probes = append(h.Probes, history.Probe{What: "recovery", Fault: 3, Kind: "agg-kill", Target: "agg1", OK: false, Detail: "readyz 503"})
		}, "not recovered"},
		{"recovered too late", Liveness, func(h *history.History) {
			h.Probes = append(h.Probes, history.Probe{What: "recovery", Fault: 3, Kind: "agg-kill", Target: "agg1", OK: true, Took: 61 * sec})
		}, "recovered after"},
		{"last change too slow", Liveness, func(h *history.History) {
			h.Probes = append(h.Probes, history.Probe{What: "propagation", Target: "gw2", OK: true, Took: 3 * sec, Measure: "blocklist"})
		}, "reached gw2 after"},
		{"never healed", Liveness, func(h *history.History) {
			h.Faults = append(h.Faults, history.Fault{ID: 4, Kind: "link-stall", Target: "gw1", Start: t0})
		}, "never healed"},
		{"polite key penalised", Liveness, func(h *history.History) {
			admit(h, "bp", "/fw", 1, t0, sec, 1, func(a *history.Answer) { a.Status = 429; a.Code = "PENALTY" })
		}, "polite key bp"},
		{"degraded without a fault, too often", Liveness, func(h *history.History) {
			admit(h, "a1", "/fw", 1, t0, 10*sec, 90)
			admit(h, "a1", "/fw", 2, t0, 10*sec, 10, degraded)
		}, "degraded with no fault in force"},
		{"degraded in a stall of the machine is explained, not after", Liveness, func(h *history.History) {
			h.Meta.StallTail = sec
			h.Stalls = []history.Stall{{Start: t0, End: t0 + sec/10}}
			admit(h, "a1", "/fw", 1, t0, 10*sec, 90)
			admit(h, "a1", "/fw", 2, t0, sec, 10, degraded)      // explained
			admit(h, "a1", "/fw", 2, t0+5*sec, sec, 6, degraded) // not
		}, "6 of 106 answers"},
		{"a link fault on one gateway does not excuse another", Liveness, func(h *history.History) {
			h.Faults = []history.Fault{{ID: 1, Kind: "link-cut", Target: "gw2", Link: &history.Link{Client: "gw2", Server: "redis"}, Start: t0, End: t0 + sec}}
			admit(h, "a1", "/fw", 2, t0, sec, 50, degraded)
			admit(h, "a1", "/fw", 1, t0, sec, 10, degraded)
			admit(h, "a1", "/fw", 3, t0+20*sec, sec, 50)
		}, "10 of 110 answers"},
		{"unplanned exit", Exits, func(h *history.History) {
			h.Procs = append(h.Procs, history.Proc{Name: "gw2", Kind: history.ProcExit, At: t0, Detail: "exit status 2"})
		}, "gw2 exited"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := base()
			h.Procs = []history.Proc{{Name: "gw1", Kind: history.ProcExit, At: t0, Planned: true}}
			if v := verdict(t, h, tc.inv); !v.Held {
				t.Fatalf("before the change: %q", v.Samples)
			}
			tc.change(h)
			balance(h)
			v := verdict(t, h, tc.inv)
			if v.Held || !strings.Contains(strings.Join(v.Samples, "\n"), tc.want) {
				t.Fatalf("held = %v, samples %q, want one with %q", v.Held, v.Samples, tc.want)
			}
		})
	}
}

func TestFigures(t *testing.T) {
	h := base()
	h.Faults = []history.Fault{{ID: 1, Kind: "gw-stop", Target: "gw2", Start: t0 + 10*sec, End: t0 + 12*sec}}
	admit(h, "a1", "/fw", 1, t0, 10*sec, 100)
	admit(h, "a1", "/fw", 2, t0+10*sec, 2*sec, 20, func(a *history.Answer) { a.Status = 0 })         // stopped: not counted
	admit(h, "a1", "/fw", 1, t0+20*sec, sec, 1, func(a *history.Answer) { a.Recv = a.Sent + 2*sec }) // late
	h.Probes = append(h.Probes,
		history.Probe{What: "recovery", Kind: "gw-stop", OK: true, Took: sec},
		history.Probe{What: "recovery", Kind: "gw-stop", OK: true, Took: 3 * sec})
	f := Check(h).Figures
	if f.InDeadlineOf != 101 || f.InDeadline != 100.0/101 {
		t.Fatalf("in deadline %v of %d, want 100/101 of 101", f.InDeadline, f.InDeadlineOf)
	}
	if r := f.Recovery["gw-stop"]; r.N != 2 || r.Max != 3 {
		t.Fatalf("recovery %+v", r)
	}
	if f.Requests != 121 || f.Answered != 101 {
		t.Fatalf("requests %d answered %d", f.Requests, f.Answered)
	}
}

func TestHistoryRoundTrip(t *testing.T) {
	h := base()
	admit(h, "a1", "/fw", 1, t0, sec, 3)
	h.Faults = []history.Fault{{ID: 1, Kind: "link-latency", Target: "gw1", Link: &history.Link{Client: "gw1", Server: "kafka"}, Detail: "50ms", Start: t0, End: t0 + sec}}
	h.Ops = []history.Op{{Kind: history.OpQuota, Key: "a1", Endpoint: "/fw", Tokens: 3, At: t0, Done: t0 + 10, Status: 200}}
	var b bytes.Buffer
	if err := history.Write(&b, h); err != nil {
		t.Fatal(err)
	}
	got, err := history.Read(&b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Answers) != 3 || len(got.Rules) != len(h.Rules) || got.Faults[0].Link.Server != "kafka" || got.Ops[0].Tokens != 3 ||
		got.Meta.Propagation != h.Meta.Propagation || len(got.Usage) != 1 || len(got.Probes) != 1 {
		t.Fatalf("round trip lost something: %+v", got)
	}
	if _, err := history.Read(strings.NewReader("{\"nothing\":1}\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("Read of a bad line: %v", err)
	}
}

func TestHealthzBound(t *testing.T) {
	h := base()
	h.Meta.HealthzBound = 3 * sec
	h.Probes = append(h.Probes,
		history.Probe{What: "healthz", Fault: 1, Kind: "agg-kill", Target: "agg1", OK: true, Took: sec},
		history.Probe{What: "healthz", Fault: 2, Kind: "agg-kill", Target: "agg2", OK: true, Took: 7 * sec, Detail: "faults in force when it started: broker"},
		history.Probe{What: "healthz", Fault: 3, Kind: "gw-kill", Target: "gw1", OK: false, Detail: "status 0"})
	v := verdict(t, h, Liveness)
	got := strings.Join(v.Samples, "\n")
	if v.Violations != 2 || !strings.Contains(got, "agg2, started again after fault 2 (agg-kill), answered /healthz only after 7s") ||
		!strings.Contains(got, "gw1, started again after fault 3 (gw-kill), never answered /healthz") {
		t.Fatalf("samples %q", v.Samples)
	}
}
