package rls_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/gateway/internal/rls"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/testwait"
)

var (
	OK        = rlsv3.RateLimitResponse_OK
	OverLimit = rlsv3.RateLimitResponse_OVER_LIMIT
	Unknown   = rlsv3.RateLimitResponse_UNKNOWN
)

// newStore starts a redis-server for the test and returns a store on it.
func newStore(t *testing.T) *redisstore.Store {
	t.Helper()
	return storeOn(t, redistest.StartTB(t).Addr(), 2*time.Second)
}

// storeOn returns a store on the Redis at addr whose calls time out after
// timeout; it closes with the test.
func storeOn(t *testing.T, addr string, timeout time.Duration) *redisstore.Store {
	t.Helper()
	c, err := redisstore.NewClient(redisstore.Config{Addrs: []string{addr}, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	s := redisstore.New(c, redisstore.WithTimeout(timeout), redisstore.WithKeyPrefix(fmt.Sprintf("rls%d", prefixes.Add(1))))
	t.Cleanup(func() {
		s.Close()
		c.Close()
	})
	return s
}

var prefixes atomic.Int64

// newGuard returns a guard on store enforcing src. Time is Redis's; every
// store has a key prefix of its own, so tests sharing a Redis never share
// counters.
func newGuard(t *testing.T, store guard.Store, src string, opts ...guard.Option) *guard.Guard {
	t.Helper()
	var rs *rules.Ruleset
	if src != "" {
		var err error
		if rs, err = rules.Load([]byte(src)); err != nil {
			t.Fatalf("rules: %v", err)
		}
	}
	g, err := guard.New(store, []byte("rls-test-secret-0123456789"), rs, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// serve starts a gRPC server with s on a loopback port and returns a
// client connected to it; both stop with the test.
func serve(t *testing.T, s *rls.Server) rlsv3.RateLimitServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer()
	s.Register(gs)
	done := make(chan error, 1)
	go func() { done <- gs.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		gs.Stop()
		if err := <-done; err != nil {
			t.Errorf("grpc serve: %v", err)
		}
	})
	return rlsv3.NewRateLimitServiceClient(conn)
}

// desc builds a descriptor from key, value pairs.
func desc(kv ...string) *ratelimitv3.RateLimitDescriptor {
	d := &ratelimitv3.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &ratelimitv3.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

// hits sets a descriptor's hits_addend.
func hits(d *ratelimitv3.RateLimitDescriptor, n uint64) *ratelimitv3.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func call(t *testing.T, c rlsv3.RateLimitServiceClient, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	resp, err := c.ShouldRateLimit(t.Context(), req)
	if err != nil {
		t.Fatalf("ShouldRateLimit: %v", err)
	}
	if len(resp.Statuses) != len(req.Descriptors) {
		t.Fatalf("%d statuses for %d descriptors", len(resp.Statuses), len(req.Descriptors))
	}
	return resp
}

func request(domain string, ds ...*ratelimitv3.RateLimitDescriptor) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds}
}

// header returns a response header's value ("" when absent).
func header(resp *rlsv3.RateLimitResponse, name string) string {
	for _, h := range resp.ResponseHeadersToAdd {
		if h.Key == name {
			return h.Value
		}
	}
	return ""
}

// remainingOf returns status i's limit_remaining, failing when the status
// has no current_limit.
func remainingOf(t *testing.T, resp *rlsv3.RateLimitResponse, i int) uint32 {
	t.Helper()
	st := resp.Statuses[i]
	if st.CurrentLimit == nil {
		t.Fatalf("status %d has no current_limit: %v", i, st)
	}
	return st.LimitRemaining
}

const mainRules = `
blocklist: ["sk_revoked_*"]
rules:
  - id: per-key
    match: {anonymous: false}
    algorithm: token_bucket
    capacity: 5
    rate: 5/1h
  - id: per-ip
    scope: ip
    match: {anonymous: true}
    algorithm: token_bucket
    capacity: 2
    rate: 2/1h
`

func TestShouldRateLimit(t *testing.T) {
	t.Parallel()
	store := newStore(t)
	g := newGuard(t, store, mainRules)
	c := serve(t, rls.New(g))
	const domain = "tollgate"

	t.Run("ok", func(t *testing.T) {
		t.Parallel()
		resp := call(t, c, request(domain, desc("api_key", "sk_ok", "path", "/v1/items", "method", "GET")))
		st := resp.Statuses[0]
		if resp.OverallCode != OK || st.Code != OK {
			t.Fatalf("codes %v / %v, want OK", resp.OverallCode, st.Code)
		}
		cl := st.CurrentLimit
		if cl.GetName() != "per-key" || cl.GetRequestsPerUnit() != 5 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_HOUR {
			t.Errorf("current_limit %v, want per-key 5 per HOUR", cl)
		}
		if st.LimitRemaining != 4 {
			t.Errorf("limit_remaining %d, want 4", st.LimitRemaining)
		}
		// One unit refills in 720 s; Reset is rounded up to a whole second.
		if d := st.DurationUntilReset.AsDuration(); d < 719*time.Second || d > 721*time.Second {
			t.Errorf("duration_until_reset %v, want about 12m", d)
		}
		for name, want := range map[string]string{
			"X-RateLimit-Limit": "5", "X-RateLimit-Remaining": "4", "X-RateLimit-Used": "1",
			"X-RateLimit-Resource": "per-key", "RateLimit-Policy": `"per-key";q=5;w=3600`, "Retry-After": "",
		} {
			if got := header(resp, name); got != want {
				t.Errorf("header %s = %q, want %q", name, got, want)
			}
		}
	})
	t.Run("over limit", func(t *testing.T) {
		t.Parallel()
		req := request(domain, desc("api_key", "sk_over"))
		for range 5 {
			if resp := call(t, c, req); resp.OverallCode != OK {
				t.Fatalf("within the limit: %v", resp)
			}
		}
		resp := call(t, c, req)
		st := resp.Statuses[0]
		if resp.OverallCode != OverLimit || st.Code != OverLimit || st.LimitRemaining != 0 {
			t.Fatalf("over the limit: %v", resp)
		}
		ra, err := strconv.Atoi(header(resp, "Retry-After"))
		if err != nil || ra < 1 || ra > 720 {
			t.Errorf("Retry-After %q, want 1..720 s", header(resp, "Retry-After"))
		}
		if got := header(resp, "X-RateLimit-Remaining"); got != "0" {
			t.Errorf("X-RateLimit-Remaining %q", got)
		}
		if len(resp.RawBody) != 0 || header(resp, "content-type") != "" {
			t.Errorf("a 429 with body %q, content-type %q: want it bodiless", resp.RawBody, header(resp, "content-type"))
		}
	})
	t.Run("blocked key", func(t *testing.T) {
		t.Parallel()
		resp := call(t, c, request(domain, desc("api_key", "sk_revoked_1")))
		st := resp.Statuses[0]
		// No rate-limit headers, as its 403 has none; its error body.
		if resp.OverallCode != OverLimit || st.Code != OverLimit || st.CurrentLimit != nil || len(resp.ResponseHeadersToAdd) != 1 ||
			header(resp, "content-type") != "application/json" || errorCode(t, resp) != guard.CodeKeyBlocked {
			t.Fatalf("blocked key: %v", resp)
		}
	})
	t.Run("invalid key", func(t *testing.T) {
		t.Parallel()
		resp := call(t, c, request(domain, desc("api_key", strings.Repeat("k", guard.MaxKeyLen+1))))
		if resp.OverallCode != OverLimit || resp.Statuses[0].Code != OverLimit || errorCode(t, resp) != guard.CodeInvalidKey {
			t.Fatalf("invalid key: %v", resp)
		}
	})
	t.Run("all or nothing", func(t *testing.T) {
		t.Parallel()
		ip := desc("remote_address", "10.0.0.9")
		for range 2 {
			if resp := call(t, c, request(domain, ip)); resp.OverallCode != OK {
				t.Fatalf("filling the IP's bucket: %v", resp)
			}
		}
		resp := call(t, c, request(domain, desc("api_key", "sk_all"), ip))
		if resp.OverallCode != OverLimit {
			t.Fatalf("overall %v, want OVER_LIMIT", resp.OverallCode)
		}
		if st := resp.Statuses[1]; st.Code != OverLimit || st.CurrentLimit.GetName() != "per-ip" {
			t.Errorf("IP descriptor: %v", st)
		}
		// The key's own rule admitted it: OK, with its bucket untouched.
		if st := resp.Statuses[0]; st.Code != OK || remainingOf(t, resp, 0) != 5 {
			t.Errorf("key descriptor: %v, want OK with 5 remaining", st)
		}
		if header(resp, "X-RateLimit-Resource") != "per-ip" || header(resp, "Retry-After") == "" {
			t.Errorf("headers %v, want the IP rule's with Retry-After", resp.ResponseHeadersToAdd)
		}
		// Later: the key was not charged by the rejected call.
		resp = call(t, c, request(domain, desc("api_key", "sk_all")))
		if got := remainingOf(t, resp, 0); resp.OverallCode != OK || got != 4 {
			t.Errorf("key after the rejected call: %v remaining %d, want OK and 4", resp.OverallCode, got)
		}
	})
	t.Run("one counter twice", func(t *testing.T) {
		t.Parallel()
		resp := call(t, c, request(domain, hits(desc("api_key", "sk_twice"), 2), hits(desc("api_key", "sk_twice", "path", "/x"), 2)))
		for i := range 2 {
			if got := remainingOf(t, resp, i); got != 1 {
				t.Errorf("descriptor %d: remaining %d, want 5-2-2 = 1", i, got)
			}
		}
		resp = call(t, c, request(domain, desc("api_key", "sk_twice"), desc("api_key", "sk_twice")))
		if resp.OverallCode != OverLimit {
			t.Errorf("1 left, 2 asked: %v", resp.OverallCode)
		}
		resp = call(t, c, request(domain, desc("api_key", "sk_twice")))
		if got := remainingOf(t, resp, 0); got != 0 || resp.OverallCode != OK {
			t.Errorf("last unit: %v remaining %d", resp.OverallCode, got)
		}
	})
	t.Run("hits_addend", func(t *testing.T) {
		t.Parallel()
		req := request(domain, desc("api_key", "sk_hits"))
		req.HitsAddend = 3
		if got := remainingOf(t, call(t, c, req), 0); got != 2 {
			t.Errorf("request hits_addend 3: remaining %d, want 2", got)
		}
		req = request(domain, hits(desc("api_key", "sk_hits"), 1))
		req.HitsAddend = 3
		if got := remainingOf(t, call(t, c, req), 0); got != 1 {
			t.Errorf("descriptor hits_addend 1 beside the request's 3: remaining %d, want 1", got)
		}
		resp := call(t, c, request(domain, hits(desc("api_key", "sk_hits"), 2)))
		if resp.OverallCode != OverLimit || header(resp, "Retry-After") == "" {
			t.Errorf("2 asked, 1 left: %v", resp)
		}
		resp = call(t, c, request(domain, hits(desc("api_key", "sk_hits"), 6)))
		if resp.OverallCode != OverLimit || header(resp, "Retry-After") != "" {
			t.Errorf("cost above the capacity (400, no Retry-After): %v", resp)
		}
	})
	t.Run("peek", func(t *testing.T) {
		t.Parallel()
		peek := func(key string) *ratelimitv3.RateLimitDescriptor { return hits(desc("api_key", key), 0) }
		resp := call(t, c, request(domain, peek("sk_peek")))
		if resp.OverallCode != OK || remainingOf(t, resp, 0) != 4 {
			t.Fatalf("peek: %v, want OK with 4 (what cost 1 would leave)", resp)
		}
		if got := remainingOf(t, call(t, c, request(domain, desc("api_key", "sk_peek"))), 0); got != 4 {
			t.Errorf("after a peek, a charge leaves %d, want 4", got)
		}

		// A peek beside a charge: the charge is made, the peek charges nothing.
		resp = call(t, c, request(domain, peek("sk_peek_a"), desc("api_key", "sk_peek_b")))
		if resp.OverallCode != OK || remainingOf(t, resp, 0) != 4 || remainingOf(t, resp, 1) != 4 {
			t.Fatalf("peek and charge: %v", resp)
		}
		resp = call(t, c, request(domain, peek("sk_peek_a"), peek("sk_peek_b")))
		if remainingOf(t, resp, 0) != 4 || remainingOf(t, resp, 1) != 3 {
			t.Errorf("after: %v, want 4 and 3", resp.Statuses)
		}

		// A peek that would be rejected refuses the call: nothing charged.
		call(t, c, request(domain, hits(desc("api_key", "sk_peek_full"), 5)))
		resp = call(t, c, request(domain, desc("api_key", "sk_peek_c"), peek("sk_peek_full")))
		if resp.OverallCode != OverLimit || resp.Statuses[1].Code != OverLimit || resp.Statuses[0].Code != Unknown {
			t.Fatalf("rejected peek: %v", resp)
		}
		if header(resp, "Retry-After") == "" {
			t.Errorf("rejected peek without Retry-After: %v", resp.ResponseHeadersToAdd)
		}
		if got := remainingOf(t, call(t, c, request(domain, peek("sk_peek_c"))), 0); got != 4 {
			t.Errorf("descriptor beside a rejected peek: peek leaves %d, want 4 (not charged)", got)
		}
	})
	t.Run("deciding descriptor", func(t *testing.T) {
		t.Parallel()
		resp := call(t, c, request(domain, desc("api_key", "sk_dec_a"), hits(desc("api_key", "sk_dec_b"), 3), desc("api_key", "sk_dec_c")))
		if got := header(resp, "X-RateLimit-Remaining"); resp.OverallCode != OK || got != "2" {
			t.Errorf("headers from the descriptor with least remaining: %q, want 2", got)
		}
	})
}

func TestDomainsAndDescriptors(t *testing.T) {
	t.Parallel()
	g := newGuard(t, newStore(t), `
rules:
  - id: shared
    match: {}
    algorithm: token_bucket
    capacity: 10
    rate: 10/1h
  - id: edge-only
    match: {domain: edge}
    algorithm: token_bucket
    capacity: 3
    rate: 3/1h
  - id: gold
    match: {descriptor: {plan: gold}}
    algorithm: sliding_window_log
    limit: 100
    window: 1h
`)
	c := serve(t, rls.New(g))
	policy := func(resp *rlsv3.RateLimitResponse) string { return header(resp, "RateLimit-Policy") }

	resp := call(t, c, request("edge", desc("api_key", "sk_dom")))
	if cl := resp.Statuses[0].CurrentLimit; cl.GetName() != "edge-only" || resp.Statuses[0].LimitRemaining != 2 {
		t.Errorf("edge: %v, want edge-only deciding with 2 left", resp.Statuses[0])
	}
	if got, want := policy(resp), `"shared";q=10;w=3600, "edge-only";q=3;w=3600`; got != want {
		t.Errorf("edge policy %q, want %q", got, want)
	}
	resp = call(t, c, request("other", desc("api_key", "sk_dom")))
	if cl := resp.Statuses[0].CurrentLimit; cl.GetName() != "shared" || resp.Statuses[0].LimitRemaining != 8 {
		t.Errorf("other domain: %v, want shared with 8 left (counter shared with edge)", resp.Statuses[0])
	}
	// An HTTP request (no domain) shares the domain-less rule's counter.
	d, err := g.Check(context.Background(), &guard.Request{Key: "sk_dom", Path: "/v1/x", Method: "GET"})
	if err != nil {
		t.Fatal(err)
	}
	if len(d.Rules) != 1 || d.Rules[0].ID != "shared" || d.Rules[0].Remaining != 7 {
		t.Errorf("HTTP request: %+v, want shared with 7 left", d.Rules)
	}
	resp = call(t, c, request("edge", desc("api_key", "sk_dom")))
	if got, want := header(resp, "RateLimit"), `"shared";r=6;t=360, "edge-only";r=1;t=1200`; got != want {
		t.Errorf("edge again: RateLimit %q, want %q", got, want)
	}

	// match: {descriptor: {plan: gold}} needs the entry with that value.
	resp = call(t, c, request("other", desc("api_key", "sk_plan", "plan", "gold")))
	if !strings.Contains(policy(resp), `"gold";q=100`) {
		t.Errorf("plan=gold: policy %q lacks gold", policy(resp))
	}
	resp = call(t, c, request("other", desc("api_key", "sk_plan", "plan", "silver")))
	if strings.Contains(policy(resp), "gold") {
		t.Errorf("plan=silver: policy %q has gold", policy(resp))
	}
	// Anonymous descriptors match by descriptor too.
	resp = call(t, c, request("other", desc("plan", "gold", "remote_address", "2001:db8::1")))
	if !strings.Contains(policy(resp), `"gold"`) {
		t.Errorf("anonymous plan=gold: policy %q lacks gold", policy(resp))
	}
}

func TestCurrentLimitUnits(t *testing.T) {
	t.Parallel()
	g := newGuard(t, newStore(t), `
rules:
  - {id: half, match: {descriptor: {u: half}}, algorithm: token_bucket, capacity: 1, refill_rate: 0.5}
  - {id: hundred, match: {descriptor: {u: hundred}}, algorithm: sliding_window_log, limit: 100, window: 1m}
  - {id: ten, match: {descriptor: {u: ten}}, algorithm: token_bucket, capacity: 10, rate: 10/1s}
  - {id: day, match: {descriptor: {u: day}}, algorithm: fixed_window, limit: 1000, window: 1d}
  - {id: gcra, match: {descriptor: {u: gcra}}, algorithm: gcra, limit: 90, window: 1h, burst: 5}
  - {id: third, match: {descriptor: {u: third}}, algorithm: sliding_window_counter, limit: 1, window: 3s}
  - {id: weekly, match: {descriptor: {u: weekly}}, algorithm: fixed_window, limit: 3, window: 7d}
  - {id: vip, match: {descriptor: {u: vip}}, algorithm: token_bucket, capacity: 10, rate: 10/1m,
     overrides: {sk_vip: {capacity: 100}}}
`)
	// A temporary override halves sk_half's limits: the rate halves with it.
	g.Controls().SetKeyOverride(g.KeyID("sk_half"), guard.Override{Override: rules.Override{Factor: 0.5}})
	c := serve(t, rls.New(g))
	const (
		second = rlsv3.RateLimitResponse_RateLimit_SECOND
		minute = rlsv3.RateLimitResponse_RateLimit_MINUTE
		hour   = rlsv3.RateLimitResponse_RateLimit_HOUR
		day    = rlsv3.RateLimitResponse_RateLimit_DAY
		week   = rlsv3.RateLimitResponse_RateLimit_WEEK
	)
	for _, tt := range []struct {
		u, key string
		n      uint32
		unit   rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{"half", "sk_u", 30, minute},       // 0.5/s: floor(rate × unit) in the smallest unit where ≥ 1
		{"hundred", "sk_u", 100, minute},   // a window of one unit: 100 per 1m is 100 per MINUTE
		{"hundred", "sk_half", 50, minute}, // factor 0.5
		{"ten", "sk_u", 10, second},
		{"day", "sk_u", 1000, day}, // 1000 per DAY, not 41 per HOUR
		{"gcra", "sk_u", 90, hour}, // its limit per its window, not its burst
		{"third", "sk_u", 20, minute},
		{"weekly", "sk_u", 3, week},   // below one a day
		{"vip", "sk_u", 10, minute},   // 10/1m
		{"vip", "sk_vip", 10, minute}, // capacity 100 refilling 10/1m: 100 in 10 minutes
		{"ten", "sk_half", 5, second}, // factor 0.5: 5 per second
	} {
		t.Run(tt.u+"/"+tt.key, func(t *testing.T) {
			resp := call(t, c, request("units", desc("api_key", tt.key, "u", tt.u)))
			cl := resp.Statuses[0].CurrentLimit
			if cl.GetName() != tt.u || cl.GetRequestsPerUnit() != tt.n || cl.GetUnit() != tt.unit {
				t.Errorf("current_limit %v, want %s %d per %v", cl, tt.u, tt.n, tt.unit)
			}
		})
	}
}

func TestInvalidArgument(t *testing.T) {
	t.Parallel()
	g := newGuard(t, newStore(t), mainRules)
	c := serve(t, rls.New(g, rls.WithMaxDescriptors(3), rls.WithMaxEntries(4), rls.WithMaxValueLen(16)))
	many := func(n int) []*ratelimitv3.RateLimitDescriptor {
		ds := make([]*ratelimitv3.RateLimitDescriptor, n)
		for i := range ds {
			ds[i] = desc("api_key", "sk_"+strconv.Itoa(i))
		}
		return ds
	}
	negative := desc("api_key", "sk_neg")
	negative.IsNegativeHits = true
	for _, tt := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"empty domain", request("", desc("api_key", "sk"))},
		{"long domain", request(strings.Repeat("d", 17), desc("api_key", "sk"))},
		{"no descriptors", request("d")},
		{"too many descriptors", &rlsv3.RateLimitRequest{Domain: "d", Descriptors: many(4)}},
		{"no entries", request("d", desc())},
		{"too many entries", request("d", desc("a", "1", "b", "2", "c", "3", "e", "4", "f", "5"))},
		{"empty key", request("d", desc("", "v"))},
		{"long key", request("d", desc(strings.Repeat("k", 17), "v"))},
		{"long value", request("d", desc("api_key", strings.Repeat("v", 17)))},
		{"conflicting repeat", request("d", desc("api_key", "sk_a", "api_key", "sk_b"))},
		{"bad remote_address", request("d", desc("remote_address", "10.0.0.300"))},
		{"remote_address with port", request("d", desc("remote_address", "10.0.0.1:80"))},
		{"negative hits", request("d", negative)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := c.ShouldRateLimit(t.Context(), tt.req)
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("error %v, want InvalidArgument", err)
			}
			if strings.Contains(err.Error(), "sk_") {
				t.Errorf("error quotes a key: %v", err)
			}
		})
	}
	// Within every limit, and an equal repeat, is fine.
	resp := call(t, c, &rlsv3.RateLimitRequest{Domain: "d", Descriptors: append(many(2), desc("api_key", "sk_r", "api_key", "sk_r"))})
	if resp.OverallCode != OK {
		t.Errorf("valid call: %v", resp)
	}
}

func TestUnavailable(t *testing.T) {
	t.Parallel()
	g := newGuard(t, newStore(t), "") // no ruleset: no decision possible
	c := serve(t, rls.New(g))
	_, err := c.ShouldRateLimit(t.Context(), request("d", desc("api_key", "sk")))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("error %v, want Unavailable", err)
	}
	c = serve(t, rls.New(nil))
	if _, err := c.ShouldRateLimit(t.Context(), request("d", desc("api_key", "sk"))); status.Code(err) != codes.Unavailable {
		t.Fatalf("nil guard: error %v, want Unavailable", err)
	}
}

// TestRedisDown: with Redis hung, the guard fails open and the answer says
// so: OK, no current_limit (nothing is known about the counter), and the
// degraded headers.
func TestRedisDown(t *testing.T) {
	t.Parallel()
	srv := redistest.StartTB(t)
	g := newGuard(t, storeOn(t, srv.Addr(), 50*time.Millisecond), mainRules)
	c := serve(t, rls.New(g))
	req := request("d", desc("api_key", "sk_down"))
	// With Redis up the answer is a real one; the first calls may miss the
	// 50 ms deadline on a loaded machine (dial, script load), so poll.
	testwait.Eventually(t, 10*time.Second, func() error {
		if resp := call(t, c, req); resp.Statuses[0].CurrentLimit == nil {
			return fmt.Errorf("with Redis up: %v", resp)
		}
		return nil
	})
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := srv.Resume(); err != nil {
			t.Errorf("resume redis: %v", err)
		}
	})
	resp := call(t, c, req)
	st := resp.Statuses[0]
	if resp.OverallCode != OK || st.Code != OK || st.CurrentLimit != nil {
		t.Errorf("with Redis hung: %v", resp)
	}
	if header(resp, "X-RateLimit-Policy") != "degraded" || header(resp, "X-RateLimit-Remaining") != "-1" {
		t.Errorf("headers %v, want the degraded ones", resp.ResponseHeadersToAdd)
	}
}

// errorCode returns the code of the JSON error body a refusal carries
// (raw_body), "" without one.
func errorCode(t *testing.T, resp *rlsv3.RateLimitResponse) string {
	t.Helper()
	if len(resp.RawBody) == 0 {
		return ""
	}
	var body struct {
		Error struct{ Code, Message string }
	}
	if err := json.Unmarshal(resp.RawBody, &body); err != nil || body.Error.Message == "" {
		t.Fatalf("raw_body %q: %v", resp.RawBody, err)
	}
	return body.Error.Code
}
