package httpguard

import (
	"maps"
	"net/http"
	"net/textproto"
	"slices"
	"strconv"
	"testing"

	"github.com/tollgate/tollgate/guard"
)

// Sample decisions shared by the header, body and middleware tests.
func allowedDecision() guard.Decision {
	return guard.Decision{
		Allowed: true, Status: 200, Reason: guard.ReasonAllowed, Deciding: 1,
		Rules: []guard.RuleResult{
			{ID: "tenant-total", Allowed: true, Limit: 10000, Remaining: 9000, Window: 60, Reset: 1_700_000_060, Next: 1},
			{ID: "search", Allowed: true, Limit: 30, Remaining: 12, Window: 60, Reset: 1_700_000_036, Next: 2},
			{ID: "new-search", Shadow: true, Allowed: false, Limit: 5, Remaining: 0, Window: 1, Reset: 1_700_000_001, Next: 1},
		},
	}
}

func rejectedDecision() guard.Decision {
	return guard.Decision{
		Status: 429, Code: guard.CodeRateLimitExceeded, Reason: guard.ReasonRateLimited, Deciding: 1,
		RetryAfter: 7,
		Rules: []guard.RuleResult{
			{ID: "tenant-total", Allowed: true, Limit: 10000, Remaining: 9000, Window: 60, Reset: 1_700_000_060, Next: 1},
			{ID: "search", Allowed: false, Limit: 30, Remaining: 0, Window: 60, Reset: 1_700_000_060, Next: 2, RetryAfter: 7},
			{ID: "burst", Allowed: false, Limit: 5, Remaining: 0, Window: 1, Reset: 1_700_000_001, Next: 1, RetryAfter: 1},
			{ID: "shadow", Shadow: true, Allowed: false, Limit: 1, Window: 1},
		},
	}
}

func failOpenDecision() guard.Decision {
	return guard.Decision{
		Allowed: true, Status: 200, Reason: guard.ReasonRedisUnavailable, Degraded: true, Deciding: 0,
		Rules: []guard.RuleResult{
			{ID: "free-default", Allowed: true, Limit: 100, Remaining: -1, Window: 60, Degraded: true, FailOpen: true},
		},
	}
}

// wantHeaders are the expected header values; "" means absent.
type wantHeaders struct {
	limit, remaining, used, reset, resource, xpolicy, retryAfter string
	// policy and rateLimit: rule id -> expected parameters; nil map means
	// the header is absent.
	policy    map[string]map[string]int64
	rateLimit map[string]map[string]int64
}

// searchPolicy is the RateLimit-Policy of the sample decisions' rules:
// tenant-total, then search (named search), then any more.
func searchPolicy(search string, more ...map[string]map[string]int64) map[string]map[string]int64 {
	p := map[string]map[string]int64{"tenant-total": {"q": 10000, "w": 60}, search: {"q": 30, "w": 60}}
	for _, m := range more {
		maps.Copy(p, m)
	}
	return p
}

// searchRemaining is the RateLimit field of the sample decisions' rules:
// tenant-total's remaining and its t (none when totalT is -1), search's
// remaining (its t is 2), then any more.
func searchRemaining(search string, total, totalT, remaining int64, more ...map[string]map[string]int64) map[string]map[string]int64 {
	t := map[string]int64{"r": total, "t": totalT}
	if totalT < 0 {
		delete(t, "t")
	}
	r := map[string]map[string]int64{"tenant-total": t, search: {"r": remaining, "t": 2}}
	for _, m := range more {
		maps.Copy(r, m)
	}
	return r
}

// The rejected decision's third rule, in each header.
var (
	burstPolicy    = map[string]map[string]int64{"burst": {"q": 5, "w": 1}}
	burstRemaining = map[string]map[string]int64{"burst": {"r": 0, "t": 1}}
)

func TestSetHeaders(t *testing.T) {
	t.Parallel()
	escaped := allowedDecision()
	escaped.Rules[1].ID = "we\"ird\\id\x01é"

	localClosed := failOpenDecision()
	localClosed.Rules[0].Remaining = 20
	localClosed.Rules[0].Limit = 25
	localClosed.Rules[0].FailOpen = false
	localClosed.Rules[0].Reset = 1_700_000_005

	noRetry := rejectedDecision()
	noRetry.RetryAfter = 0
	noRetry.Rules[1].RetryAfter = 0

	full := allowedDecision()
	full.Rules[0].Remaining, full.Rules[0].Next = 10000, 0

	debt := allowedDecision()
	debt.Rules[1].Remaining = -5 // not degraded: debt shows as 0

	tests := []struct {
		name string
		d    *guard.Decision
		want wantHeaders
	}{
		{
			name: "allowed",
			d:    ptr(allowedDecision()),
			want: wantHeaders{
				limit: "30", remaining: "12", used: "18", reset: "1700000036", resource: "search",
				policy:    searchPolicy("search"),
				rateLimit: searchRemaining("search", 9000, 1, 12),
			},
		},
		{
			name: "rejected",
			d:    ptr(rejectedDecision()),
			want: wantHeaders{
				limit: "30", remaining: "0", used: "30", reset: "1700000060", resource: "search", retryAfter: "7",
				policy:    searchPolicy("search", burstPolicy),
				rateLimit: searchRemaining("search", 9000, 1, 0, burstRemaining),
			},
		},
		{
			name: "retry after at least one second",
			d:    &noRetry,
			want: wantHeaders{
				limit: "30", remaining: "0", used: "30", reset: "1700000060", resource: "search", retryAfter: "1",
				policy:    searchPolicy("search", burstPolicy),
				rateLimit: searchRemaining("search", 9000, 1, 0, burstRemaining),
			},
		},
		{
			name: "failing open",
			d:    ptr(failOpenDecision()),
			want: wantHeaders{
				limit: "100", remaining: "-1", used: "0", reset: "0", resource: "free-default", xpolicy: "degraded",
				policy: map[string]map[string]int64{"free-default": {"q": 100, "w": 60}},
			},
		},
		{
			name: "limited locally while degraded",
			d:    &localClosed,
			want: wantHeaders{
				limit: "25", remaining: "20", used: "5", reset: "1700000005", resource: "free-default", xpolicy: "degraded",
				policy: map[string]map[string]int64{"free-default": {"q": 25, "w": 60}},
			},
		},
		{
			name: "full counter has no t",
			d:    &full,
			want: wantHeaders{
				limit: "30", remaining: "12", used: "18", reset: "1700000036", resource: "search",
				policy:    searchPolicy("search"),
				rateLimit: searchRemaining("search", 10000, -1, 12),
			},
		},
		{
			name: "debt shows as zero",
			d:    &debt,
			want: wantHeaders{
				limit: "30", remaining: "0", used: "30", reset: "1700000036", resource: "search",
				policy:    searchPolicy("search"),
				rateLimit: searchRemaining("search", 9000, 1, 0),
			},
		},
		{
			name: "escaped id",
			d:    &escaped,
			want: wantHeaders{
				limit: "30", remaining: "12", used: "18", reset: "1700000036", resource: "we\"ird\\id???",
				policy:    searchPolicy("we\"ird\\id???"),
				rateLimit: searchRemaining("we\"ird\\id???", 9000, 1, 12),
			},
		},
		{
			name: "allowlisted",
			d:    &guard.Decision{Allowed: true, Status: 200, Reason: guard.ReasonAllowlisted, Deciding: -1},
		},
		{
			name: "no rule",
			d:    &guard.Decision{Allowed: true, Status: 200, Reason: guard.ReasonNoRule, Deciding: -1},
		},
		{
			name: "blocked",
			d:    &guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1},
		},
		{
			name: "penalty without rule",
			d: &guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1,
				RetryAfter: 900},
			want: wantHeaders{retryAfter: "900"},
		},
		{
			name: "nil decision",
			d:    nil,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := http.Header{}
			SetHeaders(h, tt.d)
			checkHeaders(t, h, tt.want)

			// HeaderPairs is the same set, spelled as on the wire.
			h2 := http.Header{}
			for _, p := range HeaderPairs(tt.d, nil) {
				if h2.Get(p[0]) != "" {
					t.Errorf("HeaderPairs: %s twice", p[0])
				}
				h2.Set(p[0], p[1])
			}
			if !maps.EqualFunc(h, h2, slices.Equal) {
				t.Errorf("HeaderPairs = %v, SetHeaders = %v", h2, h)
			}
		})
	}
}

// checkHeaders compares h with want, parsing the structured fields.
func checkHeaders(t *testing.T, h http.Header, want wantHeaders) {
	t.Helper()
	for _, c := range []struct{ name, want string }{
		{"X-RateLimit-Limit", want.limit},
		{"X-RateLimit-Remaining", want.remaining},
		{"X-RateLimit-Used", want.used},
		{"X-RateLimit-Reset", want.reset},
		{"X-RateLimit-Resource", want.resource},
		{"X-RateLimit-Policy", want.xpolicy},
		{"Retry-After", want.retryAfter},
	} {
		vals := h.Values(c.name)
		switch {
		case c.want == "" && len(vals) != 0:
			t.Errorf("%s = %q, want absent", c.name, vals)
		case c.want != "" && (len(vals) != 1 || vals[0] != c.want):
			t.Errorf("%s = %q, want %q", c.name, vals, c.want)
		}
	}
	checkSFList(t, h, "RateLimit-Policy", want.policy)
	checkSFList(t, h, "RateLimit", want.rateLimit)
}

// checkSFList parses header name as an RFC 9651 List and compares each
// item (a String naming a rule) and its Integer parameters with want.
func checkSFList(t *testing.T, h http.Header, name string, want map[string]map[string]int64) {
	t.Helper()
	vals := h.Values(name)
	if want == nil {
		if len(vals) != 0 {
			t.Errorf("%s = %q, want absent", name, vals)
		}
		return
	}
	if len(vals) != 1 {
		t.Fatalf("%s = %q, want one field line", name, vals)
	}
	items := mustSFList(t, vals[0])
	if len(items) != len(want) {
		t.Errorf("%s = %q: %d items, want %d", name, vals[0], len(items), len(want))
	}
	for _, it := range items {
		id, ok := it.Value.(string)
		if !ok {
			t.Errorf("%s: item %v is not a String", name, it.Value)
			continue
		}
		params, ok := want[id]
		if !ok {
			t.Errorf("%s: unexpected item %q", name, id)
			continue
		}
		if len(it.Params) != len(params) {
			t.Errorf("%s: item %q has params %v, want %v", name, id, it.Params, params)
		}
		for k, v := range params {
			got, ok := it.Param(k)
			if !ok || got != v {
				t.Errorf("%s: item %q param %s = %v, want %d", name, id, k, got, v)
			}
		}
	}
}

func ptr[T any](v T) *T { return &v }

// Tollgate's headers replace an upstream's; a decision without headers
// removes them; an upstream Retry-After survives unless Tollgate answers
// 429 itself.
func TestSetHeadersReplaces(t *testing.T) {
	t.Parallel()
	upstream := func() http.Header {
		h := http.Header{}
		for _, n := range []string{"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Used",
			"X-RateLimit-Reset", "X-RateLimit-Resource", "X-RateLimit-Policy", "RateLimit-Policy", "RateLimit"} {
			h.Add(n, "upstream-1")
			h.Add(n, "upstream-2")
		}
		h.Set("Retry-After", "120")
		h.Set("Content-Type", "text/plain")
		return h
	}
	tests := []struct {
		name       string
		d          guard.Decision
		want       wantHeaders
		retryAfter string
	}{
		{
			name: "allowed",
			d:    allowedDecision(),
			want: wantHeaders{limit: "30", remaining: "12", used: "18", reset: "1700000036", resource: "search",
				policy:     map[string]map[string]int64{"tenant-total": {"q": 10000, "w": 60}, "search": {"q": 30, "w": 60}},
				rateLimit:  map[string]map[string]int64{"tenant-total": {"r": 9000, "t": 1}, "search": {"r": 12, "t": 2}},
				retryAfter: "120",
			},
		},
		{
			name: "allowlisted",
			d:    guard.Decision{Allowed: true, Status: 200, Reason: guard.ReasonAllowlisted, Deciding: -1},
			want: wantHeaders{retryAfter: "120"},
		},
		{
			name: "degraded drops RateLimit",
			d:    failOpenDecision(),
			want: wantHeaders{limit: "100", remaining: "-1", used: "0", reset: "0", resource: "free-default", xpolicy: "degraded",
				policy:     map[string]map[string]int64{"free-default": {"q": 100, "w": 60}},
				retryAfter: "120",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := upstream()
			SetHeaders(h, &tt.d)
			checkHeaders(t, h, tt.want)
			if got := h.Get("Content-Type"); got != "text/plain" {
				t.Errorf("Content-Type = %q, want untouched", got)
			}
		})
	}
}

func TestHeaderNames(t *testing.T) {
	t.Parallel()
	for f, n := range headerNames {
		if got := textproto.CanonicalMIMEHeaderKey(n.wire); got != n.canon {
			t.Errorf("field %d: canonical form of %q is %q, table has %q", f, n.wire, got, n.canon)
		}
	}
}

// Integers beyond RFC 9651's 15 digits are clamped so the field stays
// parseable.
func TestSetHeadersHugeValues(t *testing.T) {
	t.Parallel()
	d := guard.Decision{Allowed: true, Status: 200, Deciding: 0, Rules: []guard.RuleResult{
		{ID: "big", Allowed: true, Limit: 1 << 62, Remaining: 1 << 61, Window: 1 << 60, Next: 1 << 59},
	}}
	h := http.Header{}
	SetHeaders(h, &d)
	const sfMax = int64(999_999_999_999_999)
	checkSFList(t, h, "RateLimit-Policy", map[string]map[string]int64{"big": {"q": sfMax, "w": sfMax}})
	checkSFList(t, h, "RateLimit", map[string]map[string]int64{"big": {"r": sfMax, "t": sfMax}})
	if got, want := h.Get("X-RateLimit-Limit"), strconv.FormatInt(1<<62, 10); got != want {
		t.Errorf("X-RateLimit-Limit = %q, want %q", got, want)
	}
}

func BenchmarkSetHeaders(b *testing.B) {
	d := allowedDecision()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		h := http.Header{}
		for pb.Next() {
			SetHeaders(h, &d)
		}
	})
}

func BenchmarkHeaderPairs(b *testing.B) {
	d := rejectedDecision()
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([][2]string, 0, 16)
		for pb.Next() {
			dst = HeaderPairs(&d, dst[:0])
		}
	})
}
