package lease_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/tollgate/tollgate/compose/redisserver"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/internal/guardtest"
	"github.com/tollgate/tollgate/guard/lease"
	"github.com/tollgate/tollgate/guard/memstore"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/testwait"
)

var secret = []byte("lease-test-secret-0123456789")

// start is a Unix time in µs in the middle of an hour (fixed windows of an
// hour do not end for half an hour).
const start = 1_763_001_800_000_000

// clock is a fake clock in Unix µs; with step, every read advances it.
type clock struct {
	t    atomic.Int64
	step int64
}

func newClock(t int64) *clock { c := &clock{}; c.t.Store(t); return c }

func (c *clock) now() int64 {
	if c.step > 0 {
		return c.t.Add(c.step)
	}
	return c.t.Load()
}

func (c *clock) advance(d int64) { c.t.Add(d) }

// counting counts the calls that reach the store it wraps, by operation,
// and may hold the clock back: lag is added to the clock after each call
// (a reply that arrives that much after Redis decided).
type counting struct {
	inner guard.Store
	namer guard.Namer
	clock *clock
	lag   int64
	mu    sync.Mutex
	calls map[guard.Op]int
	names map[string]int // calls by counter name
}

func (c *counting) Do(ctx context.Context, op guard.Op, now int64, cs []guard.Counter, res []guard.CounterResult) (int64, error) {
	c.mu.Lock()
	c.calls[op]++
	if c.names == nil {
		c.names = map[string]int{}
	}
	for i := range cs {
		c.names[cs[i].Name]++
	}
	c.mu.Unlock()
	t, err := c.inner.Do(ctx, op, now, cs, res)
	if c.lag > 0 {
		c.clock.advance(c.lag)
	}
	return t, err
}

func (c *counting) CounterName(id *guard.CounterID) string { return c.namer.CounterName(id) }

// seen returns the counter names sent so far, with the calls that held
// each (all operations).
func (c *counting) seen() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.names))
	for n, k := range c.names {
		out[n] = k
	}
	return out
}

func (c *counting) count(op guard.Op) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.calls[op]
}

// rig is one Redis deployment and the stores of several gateways on it.
type rig struct {
	client redis.UniversalClient
	redis  *redisstore.Store
	clock  *clock // Redis time
}

// backend is a Redis deployment the lease guarantees are tested on: a
// standalone redis-server of the test's own, or the package's shared
// 3-primary Cluster (see sharedCluster), where each rig's counters get a
// key prefix of their own so that rigs never share a counter.
type backend struct {
	name    string
	cluster bool
}

var backends = []backend{{"standalone", false}, {"cluster", true}}

// eachBackend runs f as a parallel subtest per backend.
func eachBackend(t *testing.T, f func(t *testing.T, b backend)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			f(t, b)
		})
	}
}

// newRig starts a standalone redis-server for the test, or takes the
// shared Cluster, and a Redis store on it.
func (b backend) newRig(t *testing.T, c *clock) *rig {
	t.Helper()
	if b.cluster {
		return clusterRig(t, c, sharedCluster(t))
	}
	return rigOn(t, c, redisstore.Config{Addrs: []string{redistest.StartTB(t).Addr()}})
}

// clusterRig is a rig on cl, its counters under a key prefix of their own.
func clusterRig(t *testing.T, c *clock, cl *redisserver.Cluster) *rig {
	t.Helper()
	return rigOn(t, c, redisstore.Config{Mode: redisstore.ModeCluster, Addrs: cl.Addrs()},
		redisstore.WithKeyPrefix(fmt.Sprintf("lt%d", rigs.Add(1))))
}

// rigOn is a rig on the Redis cfg names.
func rigOn(t *testing.T, c *clock, cfg redisstore.Config, opts ...redisstore.Option) *rig {
	t.Helper()
	cfg.Timeout = 2 * time.Second
	client := guardtest.RedisClient(t, cfg)
	rs := redisstore.New(client, append([]redisstore.Option{redisstore.WithTimeout(2 * time.Second), redisstore.WithTTLMargin(time.Hour)}, opts...)...)
	t.Cleanup(func() { rs.Close() })
	return &rig{client: client, redis: rs, clock: c}
}

// rigs numbers the rigs on the shared Cluster, for their key prefixes.
var rigs atomic.Int64

// gateway is one gateway's guard on its lease store.
type gateway struct {
	calls *counting
	lease *lease.Store
	guard *guard.Guard
}

// gateway returns a gateway deciding rs, with a local clock skew µs off
// Redis's, whose Redis replies arrive lag µs after Redis decided.
func (r *rig) gateway(t *testing.T, rs *rules.Ruleset, skew, lag int64, opts ...lease.Option) *gateway {
	t.Helper()
	calls := &counting{inner: guardtest.Clocked(r.redis, r.clock.now), namer: r.redis, clock: r.clock, lag: lag, calls: map[guard.Op]int{}}
	local := func() int64 { return r.clock.now() - skew }
	// A table of 4096 counters (the tests use a few hundred at most): the
	// sweep, every 5 ms here, walks all of it, and with the default 65536
	// the sweeps of the package's gateways cost more CPU than the tests.
	ls := lease.New(calls, append([]lease.Option{lease.WithClock(local), lease.WithSweepInterval(5 * time.Millisecond), lease.WithCounters(4096)}, opts...)...)
	t.Cleanup(func() { ls.Close() })
	g, err := guard.New(ls, secret, rs, guard.WithClock(r.clock.now))
	if err != nil {
		t.Fatal(err)
	}
	return &gateway{calls: calls, lease: ls, guard: g}
}

// admit checks req on gw n times, 1 ms apart on c, each one admitted.
func admit(t *testing.T, c *clock, gw *gateway, req *guard.Request, n int) {
	t.Helper()
	for range n {
		d, err := gw.guard.Check(context.Background(), req)
		if err != nil || !d.Allowed {
			t.Fatalf("check: %v %+v", err, d)
		}
		c.advance(1000)
	}
}

func mustRules(t testing.TB, src string) *rules.Ruleset {
	t.Helper()
	rs, err := rules.Load([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	return rs
}

// fixedWindow is the source of a ruleset of one rule, fw: a fixed window
// of limit units an hour that every request matches.
func fixedWindow(limit int64) string {
	return fmt.Sprintf("rules:\n  - {id: fw, match: {}, algorithm: fixed_window, limit: %d, window: 1h}\n", limit)
}

// used returns the units Redis counts as consumed by key's counter of a
// ruleset of one rule, read without charging.
func (r *rig) used(t *testing.T, rs *rules.Ruleset, key string) int64 {
	t.Helper()
	return r.consumed(t, rs, rs, &guard.Request{Key: key, Path: "/"})
}

// TestLeasesNeverExceedGrant: three gateways, eight goroutines each,
// hammer one key's fixed window (limit 500, a window that does not end)
// until each has seen 30 rejections. The fleet admits at most the limit,
// the fast path answers most admissions and rejections locally, and once
// the gateways give back their leases (Close), Redis counts exactly the
// units admitted: every unit Redis granted was used once or given back.
func TestLeasesNeverExceedGrant(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		const limit = 500
		c := newClock(start)
		c.step = 3
		r := b.newRig(t, c)
		rs := mustRules(t, fixedWindow(limit))
		var gws []*gateway
		for i := range 3 {
			gws = append(gws, r.gateway(t, rs, int64(i)*1_000_000, 0))
		}
		var admitted atomic.Int64
		var wg sync.WaitGroup
		for _, gw := range gws {
			for range 8 {
				wg.Go(func() {
					req := &guard.Request{Key: "sk_hot", Path: "/"}
					var d guard.Decision
					for rejected := 0; rejected < 30; {
						if err := gw.guard.CheckInto(context.Background(), req, &d); err != nil {
							t.Error(err)
							return
						}
						if d.Allowed {
							admitted.Add(1)
						} else {
							rejected++
						}
					}
				})
			}
		}
		wg.Wait()
		var st lease.Stats
		calls := 0
		for _, gw := range gws {
			s := gw.lease.Stats()
			st.Lease, st.Negative, st.Granted = st.Lease+s.Lease, st.Negative+s.Negative, st.Granted+s.Granted
			calls += gw.calls.count(guard.OpCheck)
			gw.lease.Close()
		}
		t.Logf("admitted %d of limit %d; %d check calls reached Redis; from leases %d, from the negative cache %d; units leased %d",
			admitted.Load(), limit, calls, st.Lease, st.Negative, st.Granted)
		if admitted.Load() > limit {
			t.Fatalf("the fleet admitted %d, the limit is %d", admitted.Load(), limit)
		}
		if st.Lease == 0 || st.Negative == 0 {
			t.Fatalf("fast path unused: %+v", st)
		}
		if got := r.used(t, rs, "sk_hot"); got != admitted.Load() {
			t.Fatalf("after the leases were given back Redis counts %d units consumed, %d were admitted", got, admitted.Load())
		}
	})
}

// TestUnusedLeasesGivenBack: leases that expire, and leases of a ruleset
// that was replaced, give their unused units back in the background.
func TestUnusedLeasesGivenBack(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		const limit = 100_000
		c := newClock(start)
		r := b.newRig(t, c)
		rs := mustRules(t, fixedWindow(limit))
		gw := r.gateway(t, rs, 0, 0, lease.WithWindowTTL(2*time.Second))
		req := &guard.Request{Key: "sk_idle", Path: "/"}
		check := func(n int) { admit(t, c, gw, req, n) }
		check(50)
		if st := gw.lease.Stats(); st.Granted == 0 || st.Lease == 0 {
			t.Fatalf("no lease: %+v", st)
		}
		if got := r.used(t, rs, "sk_idle"); got <= 50 {
			t.Fatalf("Redis counts %d, want the 50 admitted and a lease", got)
		}
		// The lease expires: the sweep gives back what it did not use.
		c.advance(3_000_000)
		testwait.Eventually(t, 5*time.Second, func() error {
			if got := r.used(t, rs, "sk_idle"); got != 50 {
				return fmt.Errorf("Redis counts %d units, 50 admitted", got)
			}
			return nil
		})
		// A new ruleset (the same rule) drops the leases at once.
		check(50)
		gw.guard.SetRules(mustRules(t, fixedWindow(limit)+"version: 2\n"))
		testwait.Eventually(t, 5*time.Second, func() error {
			if got := r.used(t, rs, "sk_idle"); got != 100 {
				return fmt.Errorf("Redis counts %d units, 100 admitted", got)
			}
			return nil
		})
		before := gw.calls.count(guard.OpCheck)
		check(1)
		if gw.calls.count(guard.OpCheck) != before+1 {
			t.Fatal("a check after the ruleset changed was answered from a lease of the old one")
		}
	})
}

// TestTimedOutReturnNeverSentAgain: a lease's return that Redis received
// but answered too late (paused with SIGSTOP) may have run, so it is never
// sent again: after the resume Redis runs it once, and the units counted
// never fall below those admitted (a second return would give the lease's
// units back twice and let the fleet admit more than Redis granted). A
// return that surely never left (an open breaker) is still sent again.
func TestTimedOutReturnNeverSentAgain(t *testing.T) {
	t.Parallel()
	const limit = 100_000
	srv := redistest.StartTB(t)
	c := newClock(start)
	r := rigOn(t, c, redisstore.Config{Addrs: []string{srv.Addr()}}, redisstore.WithTimeout(100*time.Millisecond))
	rs := mustRules(t, fixedWindow(limit))
	gw := r.gateway(t, rs, 0, 0, lease.WithWindowTTL(2*time.Second))
	req := &guard.Request{Key: "sk_late", Path: "/"}
	for range 50 {
		if d, err := gw.guard.Check(context.Background(), req); err != nil || !d.Allowed {
			t.Fatalf("check: %v %+v", err, d)
		}
		c.advance(1000)
	}
	if got := r.used(t, rs, "sk_late"); got <= 50 {
		t.Fatalf("Redis counts %d, want the 50 admitted and a lease", got)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	// The lease expires; the sweep's return is sent and times out.
	c.advance(3_000_000)
	testwait.Eventually(t, 5*time.Second, func() error {
		if st := gw.lease.Stats(); st.Dropped == 0 {
			return fmt.Errorf("no return dropped yet: %+v", st)
		}
		return nil
	})
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	// Redis runs the late return once. Another key's lease, expired
	// after the resume, is given back by a later sweep: by then a return
	// kept for sending again would have been sent too.
	admit := func(key string, n int) {
		r := &guard.Request{Key: key, Path: "/"}
		for range n {
			if d, err := gw.guard.Check(context.Background(), r); err != nil || !d.Allowed {
				t.Fatalf("check %s: %v %+v", key, err, d)
			}
			c.advance(1000)
		}
	}
	admit("sk_after", 50)
	c.advance(3_000_000)
	testwait.Eventually(t, 5*time.Second, func() error {
		if got := r.used(t, rs, "sk_after"); got != 50 {
			return fmt.Errorf("Redis counts %d units of sk_after, 50 admitted", got)
		}
		return nil
	})
	if got := r.used(t, rs, "sk_late"); got != 50 {
		t.Fatalf("Redis counts %d units, 50 admitted: a timed-out return was sent again (fewer) or never ran (more)", got)
	}
}

// TestNegativeCacheMatchesRedis: a lease-backed guard and a guard on the
// reference model, fed the same requests at the same times, decide alike
// (admission, remaining, Retry-After, reset) for rules whose counters never
// get a lease (a sliding log; a bucket too small to lease), while the
// negative cache answers repeated rejections without Redis.
func TestNegativeCacheMatchesRedis(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		for _, rule := range []string{
			"{id: r, match: {}, algorithm: sliding_window_log, limit: 4, window: 10s}",
			"{id: r, match: {}, algorithm: token_bucket, capacity: 3, rate: 3/7s}",
			"{id: r, match: {}, algorithm: fixed_window, limit: 3, window: 4s}",
		} {
			t.Run(rule, func(t *testing.T) {
				t.Parallel()
				c := newClock(start)
				r := b.newRig(t, c)
				rs := mustRules(t, "rules:\n  - "+rule+"\n")
				gw := r.gateway(t, rs, 0, 0)
				model, err := guard.New(memstore.New(memstore.WithClock(c.now)), secret, rs, guard.WithClock(c.now))
				if err != nil {
					t.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(1, 2))
				req := &guard.Request{Key: "sk_neg", Path: "/"}
				rejections := 0
				for step := range 600 {
					switch k := rng.IntN(10); {
					case k < 6:
					case k < 9:
						c.advance(rng.Int64N(300_000))
					default:
						c.advance(rng.Int64N(3_000_000))
					}
					got, err := gw.guard.Check(context.Background(), req)
					if err != nil {
						t.Fatal(err)
					}
					want, _ := model.Check(context.Background(), req)
					if got.Allowed != want.Allowed || got.RetryAfter != want.RetryAfter ||
						got.Rules[0].Remaining != want.Rules[0].Remaining || got.Rules[0].Reset != want.Rules[0].Reset {
						t.Fatalf("step %d: lease allowed=%v retry=%d %+v\nmodel allowed=%v retry=%d %+v",
							step, got.Allowed, got.RetryAfter, got.Rules[0], want.Allowed, want.RetryAfter, want.Rules[0])
					}
					if !got.Allowed {
						rejections++
					}
				}
				st := gw.lease.Stats()
				t.Logf("%d rejections, %d answered from the negative cache, %d calls to Redis", rejections, st.Negative, gw.calls.count(guard.OpCheck))
				if st.Negative == 0 || st.Lease != 0 {
					t.Fatalf("negative cache unused, or a lease granted: %+v", st)
				}
			})
		}
	})
}

// TestRetryAfterNeverEarly: with the gateway's clock seconds off Redis's
// and replies arriving late, every Retry-After answered from the negative
// cache is honest: a client that waits exactly that long and retries once
// is admitted, and until then nothing reaches Redis.
func TestRetryAfterNeverEarly(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		for _, tc := range []struct {
			name      string
			skew, lag int64
		}{
			{"no skew", 0, 0},
			{"clock 7s behind, 40ms replies", 7_000_000, 40_000},
			{"clock 3s ahead, 900ms replies", -3_000_000, 900_000},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				c := newClock(start + 123_457)
				r := b.newRig(t, c)
				rs := mustRules(t, "rules:\n  - {id: r, match: {}, algorithm: token_bucket, capacity: 3, rate: 3/7s}\n")
				gw := r.gateway(t, rs, tc.skew, tc.lag)
				req := &guard.Request{Key: "sk_wait", Path: "/"}
				check := func() *guard.Decision {
					d, err := gw.guard.Check(context.Background(), req)
					if err != nil {
						t.Fatal(err)
					}
					return d
				}
				waits := 0
				for waits < 20 {
					d := check()
					if d.Allowed {
						continue
					}
					waits++
					calls := gw.calls.count(guard.OpCheck)
					// Impatient retries a millisecond apart are answered
					// locally, each with an honest Retry-After.
					for i := range 3 {
						c.advance(1000)
						d2 := check()
						if d2.Allowed {
							t.Fatalf("admitted %d ms after a Retry-After of %ds", i+1, d.RetryAfter)
						}
						if d2.RetryAfter > d.RetryAfter {
							t.Fatalf("Retry-After grew from %ds to %ds", d.RetryAfter, d2.RetryAfter)
						}
					}
					if n := gw.calls.count(guard.OpCheck); n != calls {
						t.Fatalf("%d rejections reached Redis while the negative cache held", n-calls)
					}
					// Exactly Retry-After after the rejection, one retry.
					c.advance(int64(d.RetryAfter)*1_000_000 - 3000)
					if d2 := check(); !d2.Allowed {
						t.Fatalf("wait %d: rejected after waiting the Retry-After of %ds: retry %ds", waits, d.RetryAfter, d2.RetryAfter)
					}
				}
			})
		}
	})
}

// TestFleetAccuracy: three gateways answer one client round robin. At 90 %
// of its limit the client is never rejected; at twice its limit the fleet
// admits at most 1 % of the limit more than the reference model does for
// the same request times, for every algorithm a lease serves. On Cluster
// the client is followed for three periods instead of five: a single counter
// is one slot, decided by the same script as on standalone, and the
// Cluster client's routing is what the shorter run checks (the Cluster's
// multi-slot requests are TestMultiSlotFleet's).
func TestFleetAccuracy(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		for _, tc := range []struct {
			rule   string
			period int64 // µs per limit's worth of units: the rate is limit per period
			limit  int64
		}{
			{"{id: r, match: {}, algorithm: token_bucket, capacity: 1000, rate: 1000/1m}", 60_000_000, 1000},
			{"{id: r, match: {}, algorithm: gcra, limit: 1000, window: 1m, burst: 1000}", 60_000_000, 1000},
			{"{id: r, match: {}, algorithm: fixed_window, limit: 1000, window: 1m}", 60_000_000, 1000},
			{"{id: r, match: {}, algorithm: sliding_window_counter, limit: 1000, window: 1m, precision: 6}", 60_000_000, 1000},
		} {
			for _, load := range []float64{0.9, 2} {
				t.Run(fmt.Sprintf("%s/load=%.1f", tc.rule, load), func(t *testing.T) {
					t.Parallel()
					c := newClock(start)
					r := b.newRig(t, c)
					rs := mustRules(t, "rules:\n  - "+tc.rule+"\n")
					var gws []*gateway
					for i := range 3 {
						gws = append(gws, r.gateway(t, rs, int64(i)*250_000, 0))
					}
					model, err := guard.New(memstore.New(memstore.WithClock(c.now)), secret, rs, guard.WithClock(c.now))
					if err != nil {
						t.Fatal(err)
					}
					req := &guard.Request{Key: "sk_client", Path: "/"}
					gap := int64(float64(tc.period) / float64(tc.limit) / load)
					rng := rand.New(rand.NewPCG(3, 4))
					var got, want, falseRej int
					periods := int64(5)
					if b.cluster {
						// At twice the rate a bucket runs dry after two
						// periods: three still test the limit.
						periods = 3
					}
					n := int(periods * tc.limit)
					for i := range n {
						// Jittered arrivals around the mean gap.
						c.advance(gap/2 + rng.Int64N(gap+1))
						d, err := gws[i%len(gws)].guard.Check(context.Background(), req)
						if err != nil {
							t.Fatal(err)
						}
						m, _ := model.Check(context.Background(), req)
						if d.Allowed {
							got++
						}
						if m.Allowed {
							want++
						}
						if m.Allowed && !d.Allowed {
							falseRej++
						}
					}
					var st lease.Stats
					for _, gw := range gws {
						s := gw.lease.Stats()
						st.Lease += s.Lease
						st.Miss += s.Miss
					}
					t.Logf("%d requests: fleet admitted %d, model %d (over-admission %d, %.2f %% of the limit); %d rejected that the model admits; %d from leases, %d misses",
						n, got, want, got-want, 100*float64(got-want)/float64(tc.limit), falseRej, st.Lease, st.Miss)
					if over := got - want; float64(over) > 0.01*float64(tc.limit) {
						t.Errorf("over-admission %d, more than 1 %% of the limit %d", over, tc.limit)
					}
					if load < 1 && got != n {
						t.Errorf("a client at %.0f %% of its limit was rejected %d times", 100*load, n-got)
					}
					if st.Lease == 0 {
						t.Errorf("no check was answered from a lease")
					}
				})
			}
		}
	})
}

// TestBypass: strict counters, shadow counters and explicit times never
// use the fast path; a reset drops a counter's lease and a quota grant
// its negative entry.
func TestBypass(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		c := newClock(start)
		c.step = 1000
		r := b.newRig(t, c)
		rs := mustRules(t, `
rules:
  - {id: strict, match: {endpoint: "^/strict"}, strict: true, algorithm: fixed_window, limit: 100000, window: 1h}
  - {id: loose, match: {endpoint: "^/loose"}, algorithm: fixed_window, limit: 100000, window: 1h}
  - {id: shadow, match: {endpoint: "^/loose/shadow"}, shadow: true, algorithm: fixed_window, limit: 100000, window: 1h}
  - {id: tiny, match: {endpoint: "^/tiny"}, algorithm: fixed_window, limit: 2, window: 1h}
`)
		gw := r.gateway(t, rs, 0, 0)
		ctx := context.Background()
		run := func(path string, n int) (calls int) {
			before := gw.calls.count(guard.OpCheck)
			for range n {
				if _, err := gw.guard.Check(ctx, &guard.Request{Key: "sk_b", Path: path}); err != nil {
					t.Fatal(err)
				}
			}
			return gw.calls.count(guard.OpCheck) - before
		}
		if n := run("/strict", 100); n != 100 {
			t.Errorf("strict rule: %d of 100 checks reached Redis", n)
		}
		if n := run("/loose/shadow", 100); n != 100 {
			t.Errorf("with a shadow rule: %d of 100 checks reached Redis", n)
		}
		if n := run("/loose", 100); n > 10 {
			t.Errorf("loose rule: %d of 100 checks reached Redis", n)
		}
		// A reset empties the counter in Redis, leases with it.
		if _, err := gw.guard.Reset(ctx, &guard.Request{Key: "sk_b", Path: "/loose"}); err != nil {
			t.Fatal(err)
		}
		if n := run("/loose", 1); n != 1 {
			t.Errorf("after a reset: %d calls, want the check to reach Redis", n)
		}
		// A counter over its limit is answered locally until a quota grant.
		run("/tiny", 5)
		if n := run("/tiny", 5); n != 0 {
			t.Errorf("over the limit: %d calls", n)
		}
		if _, err := gw.guard.AddQuota(ctx, &guard.Request{Key: "sk_b", Path: "/tiny"}, 1); err != nil {
			t.Fatal(err)
		}
		d, err := gw.guard.Check(ctx, &guard.Request{Key: "sk_b", Path: "/tiny"})
		if err != nil || !d.Allowed {
			t.Fatalf("after a quota grant: %v %+v", err, d)
		}
	})
}

// TestResetElsewhereLeavesNoOldUnits: another process (the operator API)
// resets a key's counter while a gateway holds a lease on it, and tells
// the gateway the counter's names (guard.Guard.ForgetNames). The lease's
// unused units vanished with the reset: the gateway must not give them
// back, or they would come off what another gateway charged to the fresh
// counter since, and the fleet could admit more than the limit.
func TestResetElsewhereLeavesNoOldUnits(t *testing.T) {
	t.Parallel()
	eachBackend(t, func(t *testing.T, b backend) {
		const limit = 100_000
		c := newClock(start)
		r := b.newRig(t, c)
		rs := mustRules(t, fixedWindow(limit))
		gwA := r.gateway(t, rs, 0, 0, lease.WithWindowTTL(2*time.Second))
		gwB := r.gateway(t, rs, 0, 0, lease.WithWindowTTL(2*time.Second))
		operator, err := guard.New(guardtest.Clocked(r.redis, r.clock.now), secret, rs, guard.WithClock(r.clock.now))
		if err != nil {
			t.Fatal(err)
		}
		req := &guard.Request{Key: "sk_reset", Path: "/"}
		check := func(gw *gateway, n int) { admit(t, c, gw, req, n) }
		check(gwA, 50)
		if got := r.used(t, rs, "sk_reset"); got <= 50 {
			t.Fatalf("Redis counts %d, want the 50 admitted and a lease", got)
		}
		names := operator.CounterNames(req)
		if len(names) != 1 {
			t.Fatalf("CounterNames: %q, want the one rule's counter", names)
		}
		if _, err := operator.Reset(context.Background(), req); err != nil {
			t.Fatal(err)
		}
		gwA.guard.ForgetNames(true, names)
		// B charges the fresh counter, then A comes back to it.
		check(gwB, 20)
		check(gwA, 10)
		c.advance(3_000_000)
		// Once both new leases are given back, Redis counts the 30
		// admitted since the reset: fewer if A's old lease came off them.
		testwait.Eventually(t, 5*time.Second, func() error {
			if got := r.used(t, rs, "sk_reset"); got != 30 {
				return fmt.Errorf("after the reset and 30 admissions Redis counts %d units, want 30", got)
			}
			return nil
		})
	})
}

// TestWindowLeaseServesModerateRate: a key at a moderate rate (one request
// every 2 s) under a fixed window is served by window leases that live
// fast_path.window_lease_ttl (a minute by default), not the buckets' 10 s:
// 60 requests over two minutes take a handful of Redis calls, not one
// every five requests, and once the leases are given back Redis counts
// exactly the units admitted.
func TestWindowLeaseServesModerateRate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		opts      []lease.Option
		min, max  int // Redis check calls for the 60 requests
		algorithm string
	}{
		{name: "fixed window, default", algorithm: "fixed_window, limit: 100000, window: 1h", min: 1, max: 6},
		{name: "sliding window counter, default", algorithm: "sliding_window_counter, limit: 100000, window: 1h", min: 1, max: 8},
		{name: "fixed window, 10s", algorithm: "fixed_window, limit: 100000, window: 1h", opts: []lease.Option{lease.WithWindowTTL(10 * time.Second)}, min: 9, max: 60},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newClock(start)
			r := rigOn(t, c, redisstore.Config{Addrs: []string{redistest.StartTB(t).Addr()}})
			rs := mustRules(t, "rules:\n  - {id: w, match: {}, algorithm: "+tt.algorithm+"}\n")
			gw := r.gateway(t, rs, 0, 0, tt.opts...)
			req := &guard.Request{Key: "sk_moderate", Path: "/"}
			for range 60 {
				admit(t, c, gw, req, 1)
				c.advance(2_000_000)
			}
			if n := gw.calls.count(guard.OpCheck); n < tt.min || n > tt.max {
				t.Errorf("60 requests 2 s apart took %d Redis check calls, want %d to %d", n, tt.min, tt.max)
			}
			if err := gw.lease.Close(); err != nil {
				t.Fatal(err)
			}
			if got := r.used(t, rs, "sk_moderate"); got != 60 {
				t.Fatalf("after the leases were given back Redis counts %d units, 60 were admitted", got)
			}
		})
	}
}

// TestWindowLeaseSizedToWhatIsLeft: near a window's end a lease is sized to
// the rate times what is left of the window, not times its lifetime: units
// leased for after the end would be charged to a window that is over.
func TestWindowLeaseSizedToWhatIsLeft(t *testing.T) {
	t.Parallel()
	c := newClock(start + 980_000_000) // 20 s before the hour's end
	r := rigOn(t, c, redisstore.Config{Addrs: []string{redistest.StartTB(t).Addr()}})
	rs := mustRules(t, fixedWindow(1_000_000))
	gw := r.gateway(t, rs, 0, 0)
	req := &guard.Request{Key: "sk_late", Path: "/"}
	// 10 requests/s: two misses, the second asks for a lease.
	for range 2 {
		admit(t, c, gw, req, 1)
		c.advance(99_000)
	}
	// About 10/s at the second miss, about 19.8 s left: ≈ 200 units; a
	// minute's worth would be 600.
	if g := gw.lease.Stats().Granted; g == 0 || g > 300 {
		t.Fatalf("granted %d units near the window's end, want about 200 (the rest of the window, not a minute)", g)
	}
}
