package guard_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
)

var secret = []byte("test-secret-0123456789")

func mustRules(tb testing.TB, src string) *rules.Ruleset {
	tb.Helper()
	rs, err := rules.Load([]byte(src))
	if err != nil {
		tb.Fatalf("rules: %v", err)
	}
	return rs
}

func newRedisStore(tb testing.TB, opts ...redisstore.Option) *redisstore.Store {
	tb.Helper()
	return newStoreOn(tb, guardtest.Client(tb, redistest.StartTB(tb).Addr()), opts...)
}

// newStoreOn returns a store on client, closed by the test's cleanup.
func newStoreOn(tb testing.TB, c redis.UniversalClient, opts ...redisstore.Option) *redisstore.Store {
	tb.Helper()
	s := redisstore.New(c, append([]redisstore.Option{redisstore.WithTimeout(2 * time.Second)}, opts...)...)
	tb.Cleanup(func() { s.Close() })
	return s
}

// fakeClock is a settable clock in Unix microseconds.
type fakeClock struct{ t atomic.Int64 }

func (c *fakeClock) now() int64       { return c.t.Load() }
func (c *fakeClock) advance(d int64)  { c.t.Add(d) }
func newClock(start int64) *fakeClock { c := &fakeClock{}; c.t.Store(start); return c }
func mustGuard(tb testing.TB, s guard.Store, rs *rules.Ruleset, opts ...guard.Option) *guard.Guard {
	tb.Helper()
	g, err := guard.New(s, secret, rs, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return g
}

// modelKeys are the keys and tiers of the rule sets the model tests
// replay: two pro keys of acme, one of globex, and free keys by pattern.
const modelKeys = `
keys:
  k_acme_1: {tenant: acme, tier: pro}
  k_acme_2: {tenant: acme, tier: pro}
  k_vip: {tenant: globex, tier: pro}
tiers:
  - {pattern: "k_free_*", tier: free}
`

const propertyRules = modelKeys + `routes: ["/v1/users/{id}", "/v1/orders/{id}"]
rules:
  - id: per-key
    match: {}
    algorithm: token_bucket
    capacity: %d
    rate: 7/3s
  - id: tenant-gcra
    scope: tenant
    match: {tier: pro}
    algorithm: gcra
    limit: %d
    window: 10s
    burst: 12
  - id: per-ip
    scope: ip
    match: {}
    algorithm: fixed_window
    limit: 25
    window: 2s
  - id: global
    scope: global
    match: {endpoint: "^/v1/orders"}
    algorithm: sliding_window_counter
    limit: 30
    window: 4s
    precision: 4
  - id: users-log
    match: {endpoint: "^/v1/users"}
    algorithm: sliding_window_log
    limit: 6
    window: 3s
    by_endpoint: true
  - id: free-strict
    match: {tier: free}
    algorithm: token_bucket
    capacity: 4
    rate: 4/1s
  - id: vip
    match: {api_key: "k_vip"}
    replaces: [free-strict]
    algorithm: token_bucket
    capacity: 50
    rate: 50/1m
  - id: shadow-new
    match: {}
    shadow: true
    algorithm: fixed_window
    limit: 5
    window: 1s
`

// TestGuardMatchesModel drives a Redis-backed guard and a memstore-backed
// guard with the same random requests (several keys, tenants, IPs and
// endpoints; rules of every algorithm and scope; shadow and replacing rules;
// costs; peeks and reports), the same clock, rule changes and temporary
// overrides between steps, and requires identical decisions.
func TestGuardMatchesModel(t *testing.T) {
	client := guardtest.Client(t, redistest.StartTB(t).Addr())
	ctx := context.Background()
	for seed := uint64(1); seed <= 4; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			clock := newClock(1_763_000_000_000_000 + int64(seed)*1_000_000_000_000)
			rs := mustRules(t, fmt.Sprintf(propertyRules, 10, 40))
			prefix := fmt.Sprintf("t%d%d", seed, time.Now().UnixNano()%1e6)
			store := newStoreOn(t, client, redisstore.WithTTLMargin(time.Hour), redisstore.WithKeyPrefix(prefix))
			gr := mustGuard(t, guardtest.Clocked(store, clock.now), rs, guard.WithClock(clock.now))
			gm := mustGuard(t, memstore.New(memstore.WithClock(clock.now)), rs, guard.WithClock(clock.now))

			keys := []string{"k_acme_1", "k_acme_2", "k_vip", "k_free_a", "k_free_b", "other", ""}
			ips := []netip.Addr{netip.MustParseAddr("10.0.0.1"), netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("2001:db8::1"), netip.MustParseAddr("2001:db8::2")}
			paths := []string{"/v1/users/1", "/v1/users/2", "/v1/orders/9", "/v1/search"}
			statuses := map[int]int{}
			for step := 0; step < 1500; step++ {
				switch r := rng.IntN(10); {
				case r < 3:
				case r < 8:
					clock.advance(rng.Int64N(40_000))
				default:
					clock.advance(rng.Int64N(2_000_000))
				}
				if rng.IntN(100) == 0 {
					// A rule change: new limits keep the counters.
					rs = mustRules(t, fmt.Sprintf(propertyRules, 2+rng.IntN(20), 5+rng.IntN(60)))
					gr.SetRules(rs)
					gm.SetRules(rs)
				}
				if rng.IntN(100) == 0 {
					id := gr.KeyID(keys[rng.IntN(3)])
					o := guard.Override{Override: rules.Override{Factor: 0.5, Expiry: clock.now() + 5_000_000}}
					gr.Controls().SetKeyOverride(id, o)
					if gm.Controls() != gr.Controls() {
						gm.Controls().SetKeyOverride(id, o)
					}
				}
				req := &guard.Request{
					Key:    keys[rng.IntN(len(keys))],
					Path:   paths[rng.IntN(len(paths))],
					Method: "GET",
					IP:     ips[rng.IntN(len(ips))],
					Cost:   int64(1 + rng.IntN(3)),
				}
				var dr, dm *guard.Decision
				var er, em error
				switch rng.IntN(10) {
				case 0:
					dr, er = gr.Peek(ctx, req)
					dm, em = gm.Peek(ctx, req)
				case 1:
					dr, er = gr.Report(ctx, req)
					dm, em = gm.Report(ctx, req)
				default:
					dr, er = gr.Check(ctx, req)
					dm, em = gm.Check(ctx, req)
				}
				if er != nil || em != nil {
					t.Fatalf("step %d: errors redis=%v model=%v", step, er, em)
				}
				if !reflect.DeepEqual(dr, dm) {
					t.Fatalf("step %d: request %+v\nredis %+v\nmodel %+v", step, req, dr, dm)
				}
				statuses[dr.Status]++
			}
			// The sequence must exercise both outcomes to mean anything.
			if statuses[200] < 200 || statuses[429] < 200 {
				t.Fatalf("sequence too one-sided: %v", statuses)
			}
			t.Logf("statuses: %v", statuses)
		})
	}
}

// TestTradingBotBurst is the trading-bot scenario through a real Redis with Redis
// time: one key, token bucket of 100 refilling 100/min, 500 requests as fast
// as possible. The admitted count must be exactly what the reference model
// admits when fed the decisions' Redis times, and at least the capacity.
func TestTradingBotBurst(t *testing.T) {
	store := newRedisStore(t)
	rs := mustRules(t, `
rules:
  - id: bot
    match: {}
    algorithm: token_bucket
    capacity: 100
    rate: 100/1m
`)
	g := mustGuard(t, store, rs)
	ctx := context.Background()
	req := &guard.Request{Key: "sk_bot", Path: "/v1/quotes", Method: "GET"}
	var times []int64
	var admitted []bool
	for range 500 {
		d, err := g.Check(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		times = append(times, d.Time)
		admitted = append(admitted, d.Allowed)
		if !d.Allowed && (d.Status != 429 || d.RetryAfter < 1) {
			t.Fatalf("rejection without Retry-After: %+v", d)
		}
	}
	// Replay through the model at the same times.
	var clockAt int64
	gm := mustGuard(t, memstore.New(memstore.WithClock(func() int64 { return clockAt })), rs)
	got, want := 0, 0
	for i, at := range times {
		clockAt = at
		d, err := gm.Check(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed != admitted[i] {
			t.Fatalf("request %d at %d: redis admitted=%v, model %v", i, at, admitted[i], d.Allowed)
		}
		if admitted[i] {
			got++
		}
		if d.Allowed {
			want++
		}
	}
	elapsed := float64(times[len(times)-1]-times[0]) / 1e6
	t.Logf("burst of 500 over %.3fs: %d admitted (model %d; capacity 100 + one per 0.6 s)", elapsed, got, want)
	if got < 100 || got > 100+int(elapsed/0.6)+1 {
		t.Fatalf("admitted %d, want 100 + one per 0.6 s of %.3fs", got, elapsed)
	}
}

// TestRetryAfterIsHonest: for every algorithm, a client that is rejected,
// waits exactly Retry-After and retries once is admitted, and one that
// retries a microsecond before that... may or may not be, but never waits
// longer than needed by a whole second.
func TestRetryAfterIsHonest(t *testing.T) {
	t.Parallel()
	for _, alg := range []string{
		"algorithm: token_bucket\n    capacity: 3\n    rate: 3/7s",
		"algorithm: gcra\n    limit: 3\n    window: 7s\n    burst: 2",
		"algorithm: fixed_window\n    limit: 3\n    window: 7s",
		"algorithm: sliding_window_counter\n    limit: 3\n    window: 7s\n    precision: 7",
		"algorithm: sliding_window_log\n    limit: 3\n    window: 7s",
	} {
		name := alg[len("algorithm: "):]
		name = name[:strings.IndexByte(name, '\n')]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			rs := mustRules(t, "rules:\n  - id: r\n    match: {}\n    "+alg+"\n")
			clock := newClock(1_763_000_000_123_456)
			g := mustGuard(t, memstore.New(memstore.WithClock(clock.now)), rs, guard.WithClock(clock.now))
			ctx := context.Background()
			req := &guard.Request{Key: "k", Path: "/"}
			rng := rand.New(rand.NewPCG(7, 7))
			for round := 0; round < 200; round++ {
				d, _ := g.Check(ctx, req)
				if d.Allowed {
					clock.advance(rng.Int64N(900_000))
					continue
				}
				if d.RetryAfter < 1 || d.RetryAfter < d.Rules[d.Deciding].Next {
					t.Fatalf("round %d: Retry-After %d, t %d", round, d.RetryAfter, d.Rules[d.Deciding].Next)
				}
				clock.advance(d.RetryAfter * 1_000_000)
				d2, _ := g.Check(ctx, req)
				if !d2.Allowed {
					t.Fatalf("round %d: waited Retry-After=%ds and was rejected again: %+v", round, d.RetryAfter, d2)
				}
			}
		})
	}
}

// TestRejectionConsumesNothing: a request rejected by its tenant's rule
// charges nothing to its key's rule, and vice versa, in one script call.
func TestRejectionConsumesNothing(t *testing.T) {
	store := newRedisStore(t)
	rs := mustRules(t, `
keys:
  a1: {tenant: acme}
  a2: {tenant: acme}
rules:
  - id: key
    match: {}
    algorithm: fixed_window
    limit: 5
    window: 1h
  - id: tenant
    scope: tenant
    match: {tenant: acme}
    algorithm: fixed_window
    limit: 3
    window: 1h
`)
	g := mustGuard(t, store, rs)
	ctx := context.Background()
	for i := range 3 {
		if d, _ := g.Check(ctx, &guard.Request{Key: "a1", Path: "/"}); !d.Allowed {
			t.Fatalf("request %d rejected", i)
		}
	}
	calls := store.Calls()
	d, _ := g.Check(ctx, &guard.Request{Key: "a2", Path: "/"})
	if d.Allowed || d.Rules[d.Deciding].ID != "tenant" {
		t.Fatalf("want rejection by tenant: %+v", d)
	}
	if store.Calls()-calls != 1 {
		t.Fatalf("a key+tenant decision took %d script calls, want 1", store.Calls()-calls)
	}
	// a2's key rule was not charged by the rejected request (the peek is
	// rejected by the tenant rule too, so it reports the state as is).
	d, _ = g.Peek(ctx, &guard.Request{Key: "a2", Path: "/"})
	for _, r := range d.Rules {
		if r.ID == "key" && r.Remaining != 5 {
			t.Fatalf("key rule charged by a rejected request: %+v", r)
		}
	}
}

// TestPrecedenceAndCodes covers what is decided before the counters.
func TestPrecedenceAndCodes(t *testing.T) {
	t.Parallel()
	rs := mustRules(t, `
allowlist: ["sk_internal_*"]
blocklist: ["sk_revoked_*", "sk_internal_bad"]
rules:
  - id: small
    match: {endpoint: "^/small"}
    algorithm: token_bucket
    capacity: 3
    rate: 3/1m
  - id: orders
    match: {endpoint: "^/orders"}
    algorithm: token_bucket
    capacity: 100
    rate: 100/1m
    cost: 5
  - id: blocked
    match: {endpoint: "^/admin"}
    block: true
  - id: banned
    match: {api_key: "sk_banned_*"}
    block: true
`)
	clock := newClock(1_763_000_000_000_000)
	g := mustGuard(t, memstore.New(memstore.WithClock(clock.now)), rs, guard.WithClock(clock.now), guard.WithMaxCost(50))
	ctx := context.Background()
	g.Controls().Block(g.KeyID("sk_dyn_blocked"), guard.Entry{})
	g.Controls().SetPenalty(g.KeyID("sk_penalised"), guard.Penalty{Level: 2, Until: clock.now() + 90_500_000})
	g.Controls().Allow(g.KeyID("sk_dyn_allowed"), guard.Entry{Expiry: clock.now() + 1})

	long := make([]byte, 300)
	for i := range long {
		long[i] = 'k'
	}
	for _, tc := range []struct {
		name, key, path string
		cost            int64
		status          int
		code            string
		reason          guard.Reason
		headers         bool
		retryAfter      int64
	}{
		{"blocklisted glob", "sk_revoked_1", "/small", 0, 403, guard.CodeKeyBlocked, guard.ReasonBlocklisted, false, 0},
		{"blocklist beats allowlist", "sk_internal_bad", "/small", 0, 403, guard.CodeKeyBlocked, guard.ReasonBlocklisted, false, 0},
		{"dynamic block", "sk_dyn_blocked", "/small", 0, 403, guard.CodeKeyBlocked, guard.ReasonBlocklisted, false, 0},
		{"allowlisted", "sk_internal_x", "/small", 0, 200, "", guard.ReasonAllowlisted, false, 0},
		{"penalty", "sk_penalised", "/small", 0, 429, guard.CodePenalty, guard.ReasonPenalty, false, 91},
		{"no rule", "k", "/other", 0, 200, "", guard.ReasonNoRule, false, 0},
		{"block rule", "k", "/admin/x", 0, 403, guard.CodeEndpointBlocked, guard.ReasonBlockRule, false, 0},
		{"block rule, other spelling", "k", "//x/../admin/./x", 0, 403, guard.CodeEndpointBlocked, guard.ReasonBlockRule, false, 0},
		{"block rule on keys", "sk_banned_1", "/small", 0, 403, guard.CodeKeyBlocked, guard.ReasonBlockRule, false, 0},
		{"path above the root", "k", "/../admin", 0, 400, guard.CodeInvalidPath, guard.ReasonInvalidPath, false, 0},
		{"encoded slash", "k", "/admin%2Fx", 0, 400, guard.CodeInvalidPath, guard.ReasonInvalidPath, false, 0},
		{"allowlisted key, invalid path", "sk_internal_x", "/a/%5c", 0, 400, guard.CodeInvalidPath, guard.ReasonInvalidPath, false, 0},
		{"cost above limit", "k", "/small", 4, 400, guard.CodeCostExceedsLimit, guard.ReasonCostExceedsLimit, false, 0},
		{"cost above max_cost", "k", "/small", 51, 400, guard.CodeCostExceedsLimit, guard.ReasonCostExceedsLimit, false, 0},
		{"rule cost wins", "k", "/orders", 1, 200, "", guard.ReasonAllowed, true, 0},
		{"invalid key", string(long), "/small", 0, 400, guard.CodeInvalidKey, guard.ReasonInvalidKey, false, 0},
		{"control character", "k\x01", "/small", 0, 400, guard.CodeInvalidKey, guard.ReasonInvalidKey, false, 0},
		{"C1 control character", "k\u0085", "/small", 0, 400, guard.CodeInvalidKey, guard.ReasonInvalidKey, false, 0},
		{"invalid UTF-8", "k\xff", "/small", 0, 400, guard.CodeInvalidKey, guard.ReasonInvalidKey, false, 0},
		{"space", "k k", "/small", 0, 400, guard.CodeInvalidKey, guard.ReasonInvalidKey, false, 0},
		{"UTF-8 key", "clé_ü", "/small", 0, 200, "", guard.ReasonAllowed, true, 0},
		{"allowed", "k2", "/small", 0, 200, "", guard.ReasonAllowed, true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d, err := g.Check(ctx, &guard.Request{Key: tc.key, Path: tc.path, Cost: tc.cost})
			if err != nil {
				t.Fatal(err)
			}
			if d.Status != tc.status || d.Code != tc.code || d.Reason != tc.reason || d.HasHeaders() != tc.headers || d.RetryAfter != tc.retryAfter {
				t.Fatalf("got status %d code %q reason %q headers %v retry %d", d.Status, d.Code, d.Reason, d.HasHeaders(), d.RetryAfter)
			}
			// Every decision about a valid key names its tenant (here the
			// key's own key_id), blocked and penalised ones too: their
			// events must reach the partition of the key's other events.
			if d.Status != 400 && d.Tenant != g.KeyID(tc.key) {
				t.Fatalf("tenant %q, want the key's key_id %q", d.Tenant, g.KeyID(tc.key))
			}
		})
	}
	// The ladder's top level is a block that asks for the connection-level
	// answer; an operator's block carries no level, and neither does the
	// rules file's blocklist.
	g.Controls().Block(g.KeyID("sk_ladder_top"), guard.Entry{Level: 3, Close: true, Expiry: clock.now() + 60_000_000})
	g.Controls().SetPenalty(g.KeyID("sk_ladder_2"), guard.Penalty{Level: 2, Until: clock.now() + 60_000_000})
	for _, tc := range []struct {
		key   string
		level int
		close bool
	}{{"sk_ladder_top", 3, true}, {"sk_ladder_2", 2, false}, {"sk_dyn_blocked", 0, false}, {"sk_revoked_1", 0, false}} {
		d, err := g.Check(ctx, &guard.Request{Key: tc.key, Path: "/small"})
		if err != nil {
			t.Fatal(err)
		}
		if d.PenaltyLevel != tc.level || d.CloseConnection != tc.close {
			t.Errorf("%s: level %d close %v, want %d %v", tc.key, d.PenaltyLevel, d.CloseConnection, tc.level, tc.close)
		}
	}
	d, _ := g.Check(ctx, &guard.Request{Key: "k3", Path: "/orders", Cost: 1})
	if r := d.DecidingRule(); r == nil || r.Remaining != 95 {
		t.Fatalf("rule cost 5 not charged: %+v", d.Rules)
	}
	// A cost above the limit consumed nothing.
	d, _ = g.Peek(ctx, &guard.Request{Key: "k", Path: "/small"})
	if r := d.DecidingRule(); r == nil || r.Remaining != 2 {
		t.Fatalf("peek: %+v", d.Rules)
	}
	d, _ = g.Peek(ctx, &guard.Request{Key: "k", Path: "/small"})
	if r := d.DecidingRule(); r.Remaining != 2 || !d.Peek {
		t.Fatalf("peek charged: %+v", d.Rules)
	}
}

// TestConcurrentStrictCounter: many goroutines on one counter, through
// Redis with Redis time, never admit more than the model admits for the
// decisions' times.
func TestConcurrentStrictCounter(t *testing.T) {
	store := newRedisStore(t)
	rs := mustRules(t, `
rules:
  - id: strict
    match: {}
    strict: true
    algorithm: token_bucket
    capacity: 50
    rate: 200/1s
`)
	g := mustGuard(t, store, rs)
	ctx := context.Background()
	type rec struct {
		at      int64
		allowed bool
	}
	var mu sync.Mutex
	var recs []rec
	var wg sync.WaitGroup
	for w := 0; w < 32; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := &guard.Request{Key: "shared", Path: "/"}
			for range 100 {
				d, err := g.Check(ctx, req)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				recs = append(recs, rec{d.Time, d.Allowed})
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].at < recs[j].at })
	var at int64
	gm := mustGuard(t, memstore.New(memstore.WithClock(func() int64 { return at })), rs)
	got, want := 0, 0
	for _, r := range recs {
		at = r.at
		d, _ := gm.Check(ctx, &guard.Request{Key: "shared", Path: "/"})
		if d.Allowed {
			want++
		}
		if r.allowed {
			got++
		}
	}
	t.Logf("3200 concurrent checks: redis admitted %d, model %d", got, want)
	if got != want {
		t.Fatalf("redis admitted %d, the model %d for the same times", got, want)
	}
}
