package guard_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/redisstore"
)

const multiRules = `
keys:
  k_acme_1: {tenant: acme, tier: pro}
  k_acme_2: {tenant: acme, tier: pro}
blocklist: ["k_revoked_*"]
allowlist: ["k_internal_*"]
rules:
  - id: per-key
    match: {}
    algorithm: fixed_window
    limit: 5
    window: 1m
  - id: tenant
    scope: tenant
    match: {tier: pro}
    algorithm: token_bucket
    capacity: 8
    rate: 8/1m
`

// multiStart is the fixed decision time of the CheckMany unit tests: the
// start of a minute, so fixed windows do not roll over during a test.
const multiStart = 1_763_000_040_000_000

func newMultiGuard(t *testing.T) *guard.Guard {
	t.Helper()
	clock := func() int64 { return multiStart }
	return mustGuard(t, memstore.New(memstore.WithClock(clock)), mustRules(t, multiRules), guard.WithClock(clock))
}

func checkMany(t *testing.T, g *guard.Guard, reqs ...*guard.Request) []*guard.Decision {
	t.Helper()
	ds := make([]*guard.Decision, len(reqs))
	if err := g.CheckMany(context.Background(), reqs, ds); err != nil {
		t.Fatalf("CheckMany: %v", err)
	}
	return ds
}

// remaining returns what a peek (cost 1) of key's per-key rule leaves.
func remaining(t *testing.T, g *guard.Guard, key string) int64 {
	t.Helper()
	d, err := g.Peek(context.Background(), &guard.Request{Key: key})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range d.Rules {
		if r.ID == "per-key" {
			return r.Remaining
		}
	}
	t.Fatalf("peek of %s: no per-key rule in %+v", key, d)
	return 0
}

// mustRule is ruleResult (bench_test.go), failing t when id is missing.
func mustRule(t *testing.T, d *guard.Decision, id string) guard.RuleResult {
	t.Helper()
	r := ruleResult(d, id)
	if r == nil {
		t.Fatalf("no rule %s in %+v", id, d)
	}
	return *r
}

func TestCheckMany(t *testing.T) {
	t.Parallel()
	t.Run("admitted", func(t *testing.T) {
		t.Parallel()
		g := newMultiGuard(t)
		ds := checkMany(t, g, &guard.Request{Key: "k_a", Cost: 2}, &guard.Request{Key: "k_b"})
		for i, d := range ds {
			if !d.Allowed || d.Status != 200 || d.Reason != guard.ReasonAllowed {
				t.Fatalf("decision %d: %+v", i, d)
			}
		}
		if r := mustRule(t, ds[0], "per-key").Remaining; r != 3 {
			t.Errorf("k_a remaining %d, want 3", r)
		}
		if r := mustRule(t, ds[1], "per-key").Remaining; r != 4 {
			t.Errorf("k_b remaining %d, want 4", r)
		}
		if ds[0].Time != multiStart || ds[1].Time != multiStart {
			t.Errorf("times %d, %d", ds[0].Time, ds[1].Time)
		}
	})
	t.Run("rejected call charges nothing", func(t *testing.T) {
		t.Parallel()
		g := newMultiGuard(t)
		if _, err := g.Check(context.Background(), &guard.Request{Key: "k_b", Cost: 4}); err != nil {
			t.Fatal(err)
		}
		ds := checkMany(t, g, &guard.Request{Key: "k_a"}, &guard.Request{Key: "k_b", Cost: 2})
		b := ds[1]
		if b.Allowed || b.Status != 429 || b.Reason != guard.ReasonRateLimited || b.RetryAfter < 1 {
			t.Fatalf("over-limit request: %+v", b)
		}
		a := ds[0]
		if a.Allowed || a.Status != 429 || a.Code != guard.CodeRateLimitExceeded ||
			a.Reason != guard.ReasonCallRejected || a.RetryAfter != b.RetryAfter {
			t.Fatalf("other request of the call: %+v", a)
		}
		if r := mustRule(t, a, "per-key"); !r.Allowed || r.Remaining != 5 {
			t.Errorf("other request's rule shows %+v, want allowed with all 5 left", r)
		}
		if got := remaining(t, g, "k_a"); got != 4 {
			t.Errorf("k_a after the rejected call: peek leaves %d, want 4 (nothing charged)", got)
		}
		if got := remaining(t, g, "k_b"); got != 0 {
			t.Errorf("k_b after the rejected call: peek leaves %d, want 0", got)
		}
		if k := guard.CallDeciding(ds); k != 1 {
			t.Errorf("CallDeciding = %d, want 1", k)
		}
	})
	t.Run("shared counter charged the sum", func(t *testing.T) {
		t.Parallel()
		g := newMultiGuard(t)
		ds := checkMany(t, g, &guard.Request{Key: "k_acme_1", Cost: 2}, &guard.Request{Key: "k_acme_2", Cost: 3})
		for i, d := range ds {
			if !d.Allowed {
				t.Fatalf("decision %d: %+v", i, d)
			}
			if r := mustRule(t, d, "tenant").Remaining; r != 3 {
				t.Errorf("decision %d: tenant remaining %d, want 8-2-3 = 3", i, r)
			}
		}
		// Same key twice: its per-key counter too.
		ds = checkMany(t, g, &guard.Request{Key: "k_x", Cost: 2}, &guard.Request{Key: "k_x", Cost: 2})
		for i, d := range ds {
			if !d.Allowed || mustRule(t, d, "per-key").Remaining != 1 {
				t.Fatalf("decision %d: %+v, want allowed with 1 left", i, d)
			}
		}
	})
	t.Run("summed cost above the limit", func(t *testing.T) {
		t.Parallel()
		g := newMultiGuard(t)
		ds := checkMany(t, g, &guard.Request{Key: "k_z", Cost: 3}, &guard.Request{Key: "k_z", Cost: 3}, &guard.Request{Key: "k_y"})
		for i, d := range ds[:2] {
			if d.Allowed || d.Status != 400 || d.Code != guard.CodeCostExceedsLimit || d.Cost != 6 {
				t.Fatalf("decision %d: %+v", i, d)
			}
		}
		if d := ds[2]; d.Allowed || d.Status != 400 || d.Reason != guard.ReasonCallRejected || len(d.Rules) != 0 {
			t.Fatalf("other request: %+v", d)
		}
		if got := remaining(t, g, "k_z"); got != 4 {
			t.Errorf("k_z: peek leaves %d, want 4 (nothing charged)", got)
		}
		if got := remaining(t, g, "k_y"); got != 4 {
			t.Errorf("k_y: peek leaves %d, want 4 (nothing charged)", got)
		}
	})
	t.Run("decided before the store", func(t *testing.T) {
		t.Parallel()
		g := newMultiGuard(t)
		g.Controls().SetPenalty(g.KeyID("k_pen"), guard.Penalty{Level: 1, Until: multiStart + 30_000_000})
		for _, tt := range []struct {
			key    string
			status int
			code   string
			reason guard.Reason
			retry  int64
		}{
			{"k_revoked_1", 403, guard.CodeKeyBlocked, guard.ReasonBlocklisted, 0},
			{"k_pen", 429, guard.CodePenalty, guard.ReasonPenalty, 30},
			{"bad key", 400, guard.CodeInvalidKey, guard.ReasonInvalidKey, 0},
		} {
			ds := checkMany(t, g, &guard.Request{Key: "k_a"}, &guard.Request{Key: tt.key}, &guard.Request{Key: "k_internal_1"})
			if d := ds[1]; d.Allowed || d.Status != tt.status || d.Code != tt.code || d.Reason != tt.reason || d.RetryAfter != tt.retry {
				t.Errorf("%s: %+v", tt.key, d)
			}
			for _, i := range []int{0, 2} {
				d := ds[i]
				if d.Allowed || d.Status != tt.status || d.Code != tt.code || d.Reason != guard.ReasonCallRejected ||
					d.RetryAfter != tt.retry || d.HasHeaders() || len(d.Rules) != 0 {
					t.Errorf("%s: other request %d: %+v", tt.key, i, d)
				}
			}
			if got := remaining(t, g, "k_a"); got != 4 {
				t.Errorf("%s: k_a peek leaves %d, want 4 (nothing charged)", tt.key, got)
			}
		}
	})
	t.Run("allowlisted and unmatched", func(t *testing.T) {
		t.Parallel()
		g := newMultiGuard(t)
		ds := checkMany(t, g, &guard.Request{Key: "k_internal_1"}, &guard.Request{Key: "k_a"})
		if d := ds[0]; !d.Allowed || d.Reason != guard.ReasonAllowlisted || d.HasHeaders() {
			t.Errorf("allowlisted: %+v", d)
		}
		if d := ds[1]; !d.Allowed || mustRule(t, d, "per-key").Remaining != 4 {
			t.Errorf("keyed: %+v", d)
		}
		if k := guard.CallDeciding(ds); k != 1 {
			t.Errorf("CallDeciding = %d, want 1", k)
		}
		ds = checkMany(t, g, &guard.Request{Key: "k_internal_2"})
		if !ds[0].Allowed || guard.CallDeciding(ds) != -1 {
			t.Errorf("allowlisted only: %+v, CallDeciding %d", ds[0], guard.CallDeciding(ds))
		}
	})
	t.Run("store down", func(t *testing.T) {
		t.Parallel()
		clock := func() int64 { return multiStart }
		g := mustGuard(t, downStore{}, mustRules(t, `
rules:
  - {id: open, match: {}, algorithm: fixed_window, limit: 5, window: 1m}
  - {id: closed, scope: ip, match: {}, algorithm: fixed_window, limit: 8, window: 1m, on_failure: closed}
`), guard.WithClock(clock), guard.WithFallback(memstore.New(memstore.WithClock(clock)), 0.25))
		// The fallback decides the closed rule with a quarter of its limit,
		// 2: the call's two requests share its counter and take both units.
		ip := netip.MustParseAddr("10.0.0.9")
		ds := checkMany(t, g, &guard.Request{Key: "k_a", IP: ip}, &guard.Request{Key: "k_b", IP: ip})
		for i, d := range ds {
			if !d.Allowed || !d.Degraded || d.Reason != guard.ReasonRedisUnavailable ||
				!mustRule(t, d, "open").FailOpen || mustRule(t, d, "closed").Remaining != 0 {
				t.Fatalf("decision %d: %+v", i, d)
			}
		}
		ds = checkMany(t, g, &guard.Request{Key: "k_c", IP: ip}, &guard.Request{Key: "k_d", IP: netip.MustParseAddr("10.0.0.1")})
		if d := ds[0]; d.Allowed || d.Status != 429 || d.Reason != guard.ReasonRateLimited || d.RetryAfter < 1 {
			t.Errorf("locally limited: %+v", d)
		}
		if d := ds[1]; d.Allowed || d.Reason != guard.ReasonCallRejected || mustRule(t, d, "closed").Remaining != 2 {
			t.Errorf("other request: %+v", d)
		}
	})
	t.Run("bad arguments", func(t *testing.T) {
		t.Parallel()
		g := newMultiGuard(t)
		ctx := context.Background()
		if err := g.CheckMany(ctx, []*guard.Request{{Key: "k"}}, nil); err == nil {
			t.Error("mismatched lengths: no error")
		}
		if err := g.CheckMany(ctx, []*guard.Request{nil}, make([]*guard.Decision, 1)); err == nil {
			t.Error("nil request: no error")
		}
		if err := g.CheckMany(ctx, nil, nil); err != nil {
			t.Errorf("empty call: %v", err)
		}
		empty := mustGuard(t, memstore.New(), nil)
		if err := empty.CheckMany(ctx, []*guard.Request{{Key: "k"}}, make([]*guard.Decision, 1)); !errors.Is(err, guard.ErrNoRules) {
			t.Errorf("no ruleset: %v", err)
		}
		// A nil decision is allocated; an old one's storage is reused.
		ds := []*guard.Decision{nil, {Rules: make([]guard.RuleResult, 0, 4), Allowed: false, Status: 429}}
		if err := g.CheckMany(ctx, []*guard.Request{{Key: "k_n1"}, {Key: "k_n2"}}, ds); err != nil {
			t.Fatal(err)
		}
		if ds[0] == nil || !ds[0].Allowed || !ds[1].Allowed || cap(ds[1].Rules) != 4 {
			t.Errorf("decisions %+v %+v", ds[0], ds[1])
		}
	})
}

// downStore is a Store that always fails, like an unreachable Redis.
type downStore struct{}

func (downStore) Do(context.Context, guard.Op, int64, []guard.Counter, []guard.CounterResult) (int64, error) {
	return 0, errors.New("store down")
}

func TestCallDeciding(t *testing.T) {
	t.Parallel()
	rule := func(rem, limit int64) []guard.RuleResult {
		return []guard.RuleResult{{ID: "r", Allowed: true, Remaining: rem, Limit: limit}}
	}
	ok := func(rem, limit int64) *guard.Decision {
		return &guard.Decision{Allowed: true, Status: 200, Rules: rule(rem, limit), Deciding: 0}
	}
	noHeaders := &guard.Decision{Allowed: true, Status: 200, Deciding: -1}
	rejected := func(status int, retry int64) *guard.Decision {
		return &guard.Decision{Status: status, RetryAfter: retry, Deciding: -1}
	}
	called := &guard.Decision{Status: 429, RetryAfter: 99, Reason: guard.ReasonCallRejected, Deciding: -1}
	for _, tt := range []struct {
		name string
		ds   []*guard.Decision
		want int
	}{
		{"empty", nil, -1},
		{"no headers", []*guard.Decision{noHeaders, nil}, -1},
		{"least remaining", []*guard.Decision{ok(5, 10), noHeaders, ok(2, 10), ok(3, 4)}, 2},
		{"tie to smallest limit", []*guard.Decision{ok(2, 10), ok(2, 5), ok(2, 5)}, 1},
		{"longest retry", []*guard.Decision{ok(0, 1), rejected(429, 3), called, rejected(429, 7), rejected(429, 7)}, 3},
		{"403 beside 429", []*guard.Decision{rejected(403, 0), rejected(429, 2)}, 1},
		{"403 alone", []*guard.Decision{ok(1, 1), rejected(403, 0)}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := guard.CallDeciding(tt.ds); got != tt.want {
				t.Errorf("CallDeciding = %d, want %d", got, tt.want)
			}
		})
	}
}

// TestCheckManyOneRequestIsCheckInto: a call of one request is decided
// exactly as CheckInto decides it, shadow and replacing rules, overrides
// and penalties included.
func TestCheckManyOneRequestIsCheckInto(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock := newClock(1_763_000_000_000_000)
	rs := mustRules(t, fmt.Sprintf(propertyRules, 10, 40))
	opts := []guard.Option{guard.WithClock(clock.now)}
	g1 := mustGuard(t, memstore.New(memstore.WithClock(clock.now)), rs, opts...)
	g2 := mustGuard(t, memstore.New(memstore.WithClock(clock.now)), rs, append(opts, guard.WithControls(g1.Controls()))...)
	g1.Controls().SetPenalty(g1.KeyID("k_free_b"), guard.Penalty{Level: 1, Until: clock.now() + 2_000_000})
	rng := rand.New(rand.NewPCG(7, 7))
	keys := []string{"k_acme_1", "k_acme_2", "k_vip", "k_free_a", "k_free_b", "other", "", "bad key"}
	paths := []string{"/v1/users/1", "/v1/orders/9", "/v1/search"}
	statuses := map[int]int{}
	for step := range 2000 {
		clock.advance(rng.Int64N(150_000))
		req := &guard.Request{
			Key:  keys[rng.IntN(len(keys))],
			Path: paths[rng.IntN(len(paths))],
			IP:   netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.IntN(3))}),
			Cost: int64(rng.IntN(4)),
		}
		want := &guard.Decision{}
		if err := g1.CheckInto(ctx, req, want); err != nil {
			t.Fatal(err)
		}
		got := []*guard.Decision{{}}
		if err := g2.CheckMany(ctx, []*guard.Request{req}, got); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got[0], want) {
			t.Fatalf("step %d: %+v\nCheckMany %+v\nCheckInto %+v", step, req, got[0], want)
		}
		statuses[want.Status]++
	}
	if statuses[200] < 200 || statuses[429] < 200 || statuses[400] == 0 {
		t.Fatalf("sequence too one-sided: %v", statuses)
	}
}

// multiModelRules has every algorithm and scope, a replacing rule and a
// per-key override, but no shadow rule: a shadow counter shared by two
// requests of a call is charged (or not) for the sum, which a replay one
// request at a time does not reproduce.
const multiModelRules = modelKeys + `routes: ["/v1/users/{id}"]
rules:
  - {id: per-key, match: {}, algorithm: token_bucket, capacity: 10, rate: 7/3s,
     overrides: {k_vip: {capacity: 30}}}
  - {id: tenant-gcra, scope: tenant, match: {tier: pro}, algorithm: gcra, limit: 40, window: 10s, burst: 12}
  - {id: per-ip, scope: ip, match: {}, algorithm: fixed_window, limit: 25, window: 2s}
  - {id: global, scope: global, match: {endpoint: "^/v1/orders"}, algorithm: sliding_window_counter, limit: 30, window: 4s, precision: 4}
  - {id: users-log, match: {endpoint: "^/v1/users"}, algorithm: sliding_window_log, limit: 6, window: 3s, by_endpoint: true}
  - {id: free-strict, match: {tier: free}, algorithm: token_bucket, capacity: 4, rate: 4/1s}
  - {id: vip, match: {api_key: "k_vip"}, replaces: [free-strict], algorithm: token_bucket, capacity: 50, rate: 50/1m}
`

// randomCall returns a call of 1 to 4 requests over a few keys, IPs and
// endpoints, so that requests of one call often share counters.
func randomCall(rng *rand.Rand) []*guard.Request {
	keys := []string{"k_acme_1", "k_acme_2", "k_vip", "k_free_a", "other", ""}
	paths := []string{"/v1/users/1", "/v1/users/2", "/v1/orders/9", "/v1/search"}
	reqs := make([]*guard.Request, 1+rng.IntN(4))
	for i := range reqs {
		reqs[i] = &guard.Request{
			Key:  keys[rng.IntN(len(keys))],
			Path: paths[rng.IntN(len(paths))],
			IP:   netip.AddrFrom4([4]byte{10, 0, 0, byte(rng.IntN(2))}),
			Cost: int64(1 + rng.IntN(3)),
		}
	}
	return reqs
}

// modelAnd returns a clock and two guards of multiModelRules on it: the
// reference model (an in-memory store) and one on the store other makes
// with the clock.
func modelAnd(t *testing.T, other func(now func() int64) guard.Store) (clock *fakeClock, model, g *guard.Guard) {
	t.Helper()
	clock = newClock(1_763_000_000_000_000)
	rs := mustRules(t, multiModelRules)
	model = mustGuard(t, memstore.New(memstore.WithClock(clock.now)), rs, guard.WithClock(clock.now))
	return clock, model, mustGuard(t, other(clock.now), rs, guard.WithClock(clock.now))
}

// TestCheckManyAllOrNothing drives random calls through CheckMany and
// replays them one request at a time on a second guard: an admitted call
// is replayed with CheckInto (each request must be admitted there too), a
// rejected one not at all. After every call, every counter the call touched
// must read the same on both guards: a rejected call charged nothing, and
// an admitted one charged exactly each request's cost.
func TestCheckManyAllOrNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clock, gm, gr := modelAnd(t, func(now func() int64) guard.Store { return memstore.New(memstore.WithClock(now)) })
	rng := rand.New(rand.NewPCG(3, 9))
	calls := map[bool]int{}
	for step := range 3000 {
		clock.advance(rng.Int64N(120_000))
		reqs := randomCall(rng)
		ds := make([]*guard.Decision, len(reqs))
		if err := gm.CheckMany(ctx, reqs, ds); err != nil {
			t.Fatal(err)
		}
		admitted := true
		for _, d := range ds {
			admitted = admitted && d.Allowed
		}
		calls[admitted]++
		for i, d := range ds {
			if d.Allowed != admitted {
				t.Fatalf("step %d: call admitted=%v but decision %d allowed=%v", step, admitted, i, d.Allowed)
			}
		}
		if admitted {
			for i, req := range reqs {
				d, err := gr.Check(ctx, req)
				if err != nil {
					t.Fatal(err)
				}
				if !d.Allowed {
					t.Fatalf("step %d: admitted call, but request %d alone is rejected: %+v", step, i, d)
				}
			}
		}
		for i, req := range reqs {
			pm, err := gm.Peek(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			pr, err := gr.Peek(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(pm, pr) {
				t.Fatalf("step %d (admitted=%v), request %d %+v:\nCheckMany %+v\nreplay    %+v", step, admitted, i, req, pm, pr)
			}
		}
	}
	if calls[true] < 500 || calls[false] < 500 {
		t.Fatalf("sequence too one-sided: %v", calls)
	}
	t.Logf("calls admitted/rejected: %v", calls)
}

// TestCheckManyRedis: through a real Redis, CheckMany answers as the
// reference model does for random calls, and a call is one script.
func TestCheckManyRedis(t *testing.T) {
	t.Parallel()
	store := newRedisStore(t, redisstore.WithTTLMargin(time.Hour), redisstore.WithBatch(1, 0))
	ctx := context.Background()
	clock, gm, gr := modelAnd(t, func(now func() int64) guard.Store { return guardtest.Clocked(store, now) })
	rng := rand.New(rand.NewPCG(5, 1))
	calls := map[bool]int{}
	for step := range 800 {
		clock.advance(rng.Int64N(120_000))
		reqs := randomCall(rng)
		dr := make([]*guard.Decision, len(reqs))
		dm := make([]*guard.Decision, len(reqs))
		before := store.Calls()
		if err := gr.CheckMany(ctx, reqs, dr); err != nil {
			t.Fatal(err)
		}
		if err := gm.CheckMany(ctx, reqs, dm); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(dr, dm) {
			for i := range dr {
				t.Logf("request %d %+v\nredis %+v\nmodel %+v", i, reqs[i], dr[i], dm[i])
			}
			t.Fatalf("step %d: redis and model disagree", step)
		}
		want := int64(1)
		for _, d := range dr {
			if d.Code == guard.CodeCostExceedsLimit {
				want = 0 // rejected before the store
			}
		}
		if n := store.Calls() - before; n != want {
			t.Fatalf("step %d: %d scripts for one call, want %d", step, n, want)
		}
		calls[dr[0].Allowed]++
	}
	if calls[true] < 100 || calls[false] < 100 {
		t.Fatalf("sequence too one-sided: %v", calls)
	}
	t.Logf("calls admitted/rejected: %v", calls)
}
