package abuse

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/memtest"
	"github.com/tollgate/tollgate/internal/testnet"
)

// start is the simulation's epoch: event time and wall clock are one
// clock here (gateways take event time from Redis, the aggregator its wall
// clock; on one machine they agree).
var start = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// simGateway decides like a gateway: a fixed window of limit requests per
// second per key, scaled by a level-1 factor, every request 429 PENALTY
// with Retry-After = the remaining cooldown at level 2, 403 at level 3 —
// enforcing each step delay after the aggregator took it (KV propagation).
type simGateway struct {
	limit   int64
	delay   time.Duration
	pending []Step
	applied map[string]Step
	used    map[string]int64 // requests admitted in the current second
	second  map[string]int64
}

func newSimGateway(limit int64, delay time.Duration) *simGateway {
	return &simGateway{limit: limit, delay: delay, applied: map[string]Step{}, used: map[string]int64{}, second: map[string]int64{}}
}

func (g *simGateway) publish(steps []Step) { g.pending = append(g.pending, steps...) }

func (g *simGateway) decide(key string, now time.Time) Decision {
	us := now.UnixMicro()
	for len(g.pending) > 0 && g.pending[0].StartsAt+g.delay.Microseconds() <= us {
		g.applied[g.pending[0].KeyID] = g.pending[0]
		g.pending = g.pending[1:]
	}
	d := Decision{KeyID: key, KeyPrefix: "sk_…", Tenant: "acme", TimeMicros: us, Allowed: true, Reason: "allowed"}
	limit := g.limit
	if st, ok := g.applied[key]; ok && st.ExpiresAt > us {
		switch st.Level {
		case LevelBlock:
			d.Allowed, d.Reason = false, "blocklisted"
			return d
		case LevelCooldown:
			d.Allowed, d.Reason = false, "penalty"
			d.RetryAfter = max(1, (st.ExpiresAt-us+999_999)/1_000_000)
			return d
		case LevelReduced:
			limit = max(1, int64(float64(limit)*st.Factor))
		}
	}
	sec := us / 1_000_000
	if g.second[key] != sec {
		g.second[key], g.used[key] = sec, 0
	}
	if g.used[key] < limit {
		g.used[key]++
		return d
	}
	d.Allowed, d.Reason = false, "rate_limited"
	d.RetryAfter = (sec+1)*1_000_000 - us
	d.RetryAfter = (d.RetryAfter + 999_999) / 1_000_000
	return d
}

// client is a key's traffic: it sends every interval, and a polite one
// waits out each Retry-After before its next request.
type client struct {
	key      string
	interval time.Duration
	polite   bool
	stopAt   time.Time
	next     time.Time
}

// sim drives clients through a gateway and the aggregator's table: one
// transaction per poll, every tick of the wall clock.
type sim struct {
	t       *testing.T
	tab     *Table
	gw      *simGateway
	now     time.Time
	poll    time.Duration
	steps   []Step
	firings map[string]int
}

func newSim(t *testing.T, cfg Config) *sim {
	return &sim{t: t, tab: NewTable(cfg, 0, nil), gw: newSimGateway(100, 500*time.Millisecond), now: start,
		poll: 100 * time.Millisecond, firings: map[string]int{}}
}

// run advances the simulation to until, in steps of 1ms.
func (s *sim) run(until time.Time, clients ...*client) {
	x := s.tab.Begin()
	lastPoll := s.now
	for s.now.Before(until) {
		for _, c := range clients {
			for !c.next.After(s.now) && (c.stopAt.IsZero() || s.now.Before(c.stopAt)) {
				d := s.gw.decide(c.key, s.now)
				x.Observe(&d, s.now)
				c.next = s.now.Add(c.interval)
				if c.polite && d.RetryAfter > 0 {
					c.next = s.now.Add(time.Duration(d.RetryAfter) * time.Second)
				}
			}
		}
		if s.now.Sub(lastPoll) >= s.poll {
			lastPoll = s.now
			s.commit(x)
			x = s.tab.Begin()
		}
		s.now = s.now.Add(time.Millisecond)
	}
	s.commit(x)
}

func (s *sim) commit(x *Txn) {
	x.Evaluate(s.now)
	x.Tick(s.now)
	_ = x.Changes()
	steps := x.Steps()
	for d, n := range x.Firings() {
		s.firings[d] += n
	}
	x.Commit()
	s.steps = append(s.steps, steps...)
	s.gw.publish(steps)
}

// idle advances the wall clock without traffic, ticking every second.
func (s *sim) idle(d time.Duration) {
	end := s.now.Add(d)
	for s.now.Before(end) {
		s.now = s.now.Add(time.Second)
		x := s.tab.Begin()
		x.Tick(s.now)
		s.steps = append(s.steps, x.Steps()...)
		s.gw.publish(x.Steps())
		x.Commit()
	}
}

func (s *sim) levels() []int {
	var out []int
	for _, st := range s.steps {
		out = append(out, st.Level)
	}
	return out
}

func TestIgnoringClientClimbsToTheTop(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	storm := &client{key: "storm", interval: time.Millisecond, next: start}
	s.run(start.Add(20*time.Second), storm)
	if got := s.levels(); !reflect.DeepEqual(got, []int{1, 2, 3}) {
		t.Fatalf("levels %v, want 1, 2, 3", got)
	}
	for i, st := range s.steps {
		var detectors []string
		for _, ev := range st.Evidence {
			detectors = append(detectors, ev.Detector)
		}
		if st.Previous != i || st.Step != uint64(i+1) || len(st.Evidence) == 0 || st.Reason == "" ||
			st.IssuedBy != strings.Join(detectors, ",") {
			t.Errorf("step %d: %+v, want issued by its evidence's detectors", i, st)
		}
		if got, want := time.Duration(st.ExpiresAt-st.StartsAt)*time.Microsecond, s.tab.cfg.Duration(st.Level); got != want {
			t.Errorf("step %d enforced for %v, want %v", i, got, want)
		}
	}
	if s.steps[0].Action != "reduced_limit" || s.steps[0].Factor != 0.5 || s.steps[1].Action != "cooldown" || s.steps[2].Action != "blocklist" {
		t.Errorf("actions %q %q %q", s.steps[0].Action, s.steps[1].Action, s.steps[2].Action)
	}
	if e := s.steps[0].Evidence[0]; e.Detector != DetectorBackoffIgnored || e.Ignored < 20 || e.Ratio < 0.5 || e.First == 0 || e.Last < e.First {
		t.Errorf("first evidence %+v, want backoff_ignored with ≥ 20 ignored, ≥ 50 %%", e)
	}
	// Each climb counted only decisions made at the level before it: at
	// least Grace after the previous step's newest evidence.
	for i := 1; i < len(s.steps); i++ {
		if first := s.steps[i].Evidence[0].First; first < s.steps[i-1].Evidence[0].Last+s.tab.cfg.Grace.Microseconds() {
			t.Errorf("step %d counted a decision at %d, within the grace of step %d (last %d)", i, first, i-1, s.steps[i-1].Evidence[0].Last)
		}
	}
	// At the top, the storm keeps firing on its 403s: no new step, and
	// the block holds.
	s.run(s.now.Add(30*time.Second), storm)
	if got := s.levels(); len(got) != 3 {
		t.Fatalf("a key at the top took more steps while blocked: %v", got)
	}
	if s.firings[DetectorSustainedRejection] < 2 {
		t.Errorf("firings %v: the blocked storm should keep firing sustained_rejection", s.firings)
	}
}

func TestPoliteClientNeverClimbs(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	polite := &client{key: "polite", interval: time.Millisecond, polite: true, next: start}
	s.run(start.Add(3*time.Minute), polite)
	if len(s.steps) != 0 || len(s.firings) != 0 {
		t.Fatalf("a client honouring Retry-After took steps %+v (firings %v)", s.steps, s.firings)
	}
	st, _ := s.tab.Get("polite")
	if st.Level != 0 {
		t.Fatalf("level %d", st.Level)
	}
	// Memory stays bounded: a quiet key that never took a step is dropped
	// once idle.
	s.idle(2 * time.Minute)
	if s.tab.Len() != 0 {
		t.Fatalf("%d keys held after two idle windows", s.tab.Len())
	}
}

func TestStepDownAfterQuietPeriod(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{QuietPeriod: 10 * time.Minute})
	storm := &client{key: "storm", interval: time.Millisecond, next: start, stopAt: start.Add(15 * time.Second)}
	s.run(start.Add(20*time.Second), storm)
	if got := s.levels(); !reflect.DeepEqual(got, []int{1, 2, 3}) {
		t.Fatalf("levels %v", got)
	}
	top := s.steps[2]
	// Quiet, but not for long enough yet.
	s.idle(9 * time.Minute)
	if len(s.steps) != 3 {
		t.Fatalf("stepped down before the quiet period: %+v", s.steps[3:])
	}
	s.idle(2 * time.Minute)
	if got := s.levels(); !reflect.DeepEqual(got, []int{1, 2, 3, 2}) {
		t.Fatalf("levels %v, want a step down to 2", got)
	}
	down := s.steps[3]
	if down.Action != ActionStepDown || down.Previous != 3 || down.IssuedBy != "ladder" ||
		down.ExpiresAt != down.StartsAt+s.tab.cfg.CooldownFor.Microseconds() || down.ExpiresAt > top.ExpiresAt {
		t.Fatalf("step down %+v: want a 15m cooldown, within the block's end %d", down, top.ExpiresAt)
	}
	s.idle(10 * time.Minute)
	if got := s.levels(); !reflect.DeepEqual(got, []int{1, 2, 3, 2, 1}) {
		t.Fatalf("levels %v, want a step down to 1", got)
	}
	// Level 1 enforces at most what was left of the cooldown: 5 minutes.
	if one := s.steps[4]; one.ExpiresAt != one.StartsAt+5*time.Minute.Microseconds() || one.Factor != 0.5 {
		t.Fatalf("step to 1: %+v", one)
	}
	s.idle(10 * time.Minute)
	if got := s.levels(); !reflect.DeepEqual(got, []int{1, 2, 3, 2, 1, 0}) {
		t.Fatalf("levels %v, want a step down to 0", got)
	}
	if zero := s.steps[5]; zero.ExpiresAt != 0 {
		t.Fatalf("step to 0: %+v", zero)
	}
	for i, st := range s.steps { // every step, up or down, counts one
		if st.Step != uint64(i+1) || st.KeyID != "storm" || st.KeyPrefix != "sk_…" || st.Tenant != "acme" {
			t.Fatalf("step %d: %+v, want step number %d of key storm (sk_…, acme)", i, st, i+1)
		}
	}
	// Level 0 and idle: the state is kept while its step counter matters,
	// then dropped.
	s.idle(3 * time.Minute)
	if s.tab.Len() != 1 {
		t.Fatalf("%d keys held: a key that took steps is remembered", s.tab.Len())
	}
	s.idle(7 * 24 * time.Hour)
	if s.tab.Len() != 0 {
		t.Fatalf("%d keys held after the key went idle at level 0", s.tab.Len())
	}
}

func TestStepDownNeverExtendsEnforcement(t *testing.T) {
	t.Parallel()
	// A block shorter than the quiet period: it runs out first, and the
	// step down to 2 enforces nothing (ExpiresAt in the past).
	s := newSim(t, Config{QuietPeriod: 10 * time.Minute, BlockFor: 5 * time.Minute})
	storm := &client{key: "storm", interval: time.Millisecond, next: start, stopAt: start.Add(15 * time.Second)}
	s.run(start.Add(20*time.Second), storm)
	s.idle(11 * time.Minute)
	if len(s.steps) != 4 {
		t.Fatalf("levels %v", s.levels())
	}
	if down := s.steps[3]; down.Level != 2 || down.ExpiresAt > down.StartsAt || down.ExpiresAt != s.steps[2].ExpiresAt {
		t.Fatalf("step down %+v: want level 2 with the block's past expiry", down)
	}
	// Back to abuse while at level 2 without enforcement: it climbs.
	storm.stopAt = time.Time{}
	storm.next = s.now
	s.run(s.now.Add(10*time.Second), storm)
	if got := s.levels(); got[4] != 3 {
		t.Fatalf("levels %v: a repeat offender at level 2 climbs to 3", got)
	}
}

func TestReblockOnceTheBlockRanOut(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{BlockFor: 30 * time.Second, QuietPeriod: time.Hour})
	storm := &client{key: "storm", interval: time.Millisecond, next: start}
	s.run(start.Add(20*time.Second), storm)
	s.run(start.Add(2*time.Minute), storm)
	got := s.levels()
	if len(got) < 4 || got[3] != 3 || s.steps[3].Previous != 3 {
		t.Fatalf("levels %v: a storm outlasting the block is blocked again", got)
	}
}

func TestLift(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{})
	storm := &client{key: "storm", interval: time.Millisecond, next: start, stopAt: start.Add(10 * time.Second)}
	s.run(start.Add(10*time.Second), storm)
	if len(s.steps) == 0 {
		t.Fatal("no step")
	}
	// Decisions made before the lift, still on their way, never count.
	old := make([]Decision, 0, 400)
	for i := range 400 {
		at := s.now.Add(-time.Duration(i) * time.Millisecond).UnixMicro()
		old = append(old, Decision{KeyID: "storm", TimeMicros: at, Allowed: false, RetryAfter: 1, Reason: "rate_limited"})
	}
	lift := Lift{KeyID: "storm", Tenant: "acme", TimeMicros: s.now.UnixMicro(), Actor: "alice", Reason: "customer fixed their client"}
	x := s.tab.Begin()
	if !x.Lift(lift, s.now) {
		t.Fatal("lift changed nothing")
	}
	if x.Lift(lift, s.now) {
		t.Fatal("the same lift applied twice")
	}
	for i := range old {
		x.Observe(&old[i], s.now)
	}
	x.Evaluate(s.now)
	steps := x.Steps()
	x.Commit()
	if len(steps) != 1 || steps[0].Action != ActionLifted || steps[0].Level != 0 || steps[0].IssuedBy != "alice" || steps[0].ExpiresAt != 0 ||
		steps[0].Step != s.steps[len(s.steps)-1].Step+1 || steps[0].Previous != s.steps[len(s.steps)-1].Level {
		t.Fatalf("steps %+v, want one lift, the step after %+v", steps, s.steps[len(s.steps)-1])
	}
	st, _ := s.tab.Get("storm")
	if st.Level != 0 || st.Ring != ([Buckets]Bucket{}) || st.RetryUntil != 0 {
		t.Fatalf("after the lift: %+v", st)
	}
	// The same command again, in a later transaction: nothing.
	x = s.tab.Begin()
	if x.Lift(lift, s.now.Add(time.Second)) || len(x.Steps()) != 0 {
		t.Fatal("a replayed lift took a step")
	}
	// A lift for a key without state keeps the floor.
	x = s.tab.Begin()
	x.Lift(Lift{KeyID: "new", TimeMicros: s.now.UnixMicro()}, s.now)
	x.Commit()
	if st, ok := s.tab.Get("new"); !ok || st.Floor != s.now.UnixMicro()+1 {
		t.Fatalf("lift of an unknown key: %+v", st)
	}
}

func TestAllowlistedNeverPenalised(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{VolumeCeiling: 10})
	x := s.tab.Begin()
	for i := range 5000 {
		d := Decision{KeyID: "vip", TimeMicros: start.Add(time.Duration(i) * time.Millisecond).UnixMicro(), Allowed: true, Reason: ReasonAllowlisted}
		x.Observe(&d, start)
	}
	x.Evaluate(start)
	if len(x.Steps()) != 0 || !x.Empty() {
		t.Fatalf("allowlisted decisions counted: %+v", x.Steps())
	}
	// A key penalised before it was allowlisted is lifted by its first
	// allowlisted decision.
	storm := &client{key: "storm", interval: time.Millisecond, next: start, stopAt: start.Add(3 * time.Second)}
	s.run(start.Add(3*time.Second), storm)
	if len(s.steps) == 0 {
		t.Fatal("no step")
	}
	x = s.tab.Begin()
	d := Decision{KeyID: "storm", TimeMicros: s.now.UnixMicro(), Allowed: true, Reason: ReasonAllowlisted}
	x.Observe(&d, s.now)
	x.Observe(&d, s.now)
	if steps := x.Steps(); len(steps) != 1 || steps[0].Action != ActionLifted || steps[0].IssuedBy != "allowlist" {
		t.Fatalf("steps %+v, want one lift by the allowlist", steps)
	}
}

func TestVolumeCeiling(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{VolumeCeiling: 50, Window: 10 * time.Second})
	s.gw.limit = 1_000_000
	hot := &client{key: "hot", interval: 10 * time.Millisecond, next: start} // 100/s, never rejected
	s.run(start.Add(15*time.Second), hot)
	if len(s.steps) == 0 || s.steps[0].Evidence[0].Detector != DetectorVolumeCeiling || s.steps[0].Evidence[0].RatePerSecond <= 50 {
		t.Fatalf("steps %+v, want a volume_ceiling step", s.steps)
	}
	if n := s.tab.VolumeKeys(s.now); n != 1 {
		t.Fatalf("VolumeKeys %d, want 1", n)
	}
	if n := s.tab.VolumeKeys(s.now.Add(time.Minute)); n != 0 {
		t.Fatalf("VolumeKeys a minute later %d, want 0", n)
	}
	// Disabled, it never fires.
	s = newSim(t, Config{VolumeCeiling: 50, Window: 10 * time.Second, Detectors: []string{DetectorBackoffIgnored}})
	s.gw.limit = 1_000_000
	s.run(start.Add(15*time.Second), &client{key: "hot", interval: 10 * time.Millisecond, next: start})
	if len(s.steps) != 0 {
		t.Fatalf("disabled detector fired: %+v", s.steps)
	}
}

func TestOffDetectsNothingButDrains(t *testing.T) {
	t.Parallel()
	s := newSim(t, Config{QuietPeriod: time.Minute})
	s.run(start.Add(10*time.Second), &client{key: "storm", interval: time.Millisecond, next: start})
	n := len(s.steps)
	if n == 0 {
		t.Fatal("no step")
	}
	cfg := s.tab.cfg
	cfg.Off = true
	s.tab = NewTable(cfg, 0, s.tab.states())
	s.run(s.now.Add(10*time.Second), &client{key: "storm2", interval: time.Millisecond, next: s.now})
	if len(s.steps) != n {
		t.Fatalf("detection off, yet steps %+v", s.steps[n:])
	}
	s.idle(4 * time.Minute)
	if st, _ := s.tab.Get("storm"); st.Level != 0 {
		t.Fatalf("detection off: the penalty in force did not drain (level %d)", st.Level)
	}
}

// TestOutOfOrderDecisions: a request made before a rejection, delivered
// after it, did not ignore that rejection's Retry-After.
func TestOutOfOrderDecisions(t *testing.T) {
	t.Parallel()
	tab := NewTable(Config{BackoffMinIgnored: 1, BackoffMinShare: 0.01}, 0, nil)
	x := tab.Begin()
	t0 := start.UnixMicro()
	rej := Decision{KeyID: "k", TimeMicros: t0 + 500_000, RetryAfter: 5, Reason: "rate_limited"}
	x.Observe(&rej, start)
	for i := range 10 {
		d := Decision{KeyID: "k", TimeMicros: t0 + int64(i)*1000, Allowed: true, Reason: "allowed"}
		x.Observe(&d, start)
	}
	x.Evaluate(start)
	if len(x.Steps()) != 0 {
		t.Fatalf("earlier requests counted as ignoring a later Retry-After: %+v", x.Steps())
	}
	d := Decision{KeyID: "k", TimeMicros: t0 + 600_000, Allowed: false, Reason: "rate_limited", RetryAfter: 5}
	x.Observe(&d, start)
	x.Evaluate(start)
	if len(x.Steps()) != 1 {
		t.Fatalf("a request inside the Retry-After not counted: %+v", x.Steps())
	}
}

// TestAbortReplayMatchesCommit is the exactly-once property of the logic:
// a transaction that aborts and is replayed with the same decisions ends
// in the same states and steps as one that commits at the first attempt;
// and a table rebuilt from the committed states (a new owner, a restart)
// continues as the original would.
func TestAbortReplayMatchesCommit(t *testing.T) {
	t.Parallel()
	for seed := range uint64(10) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			cfg := Config{Window: 10 * time.Second, BackoffMinIgnored: 5, RejectionMinRequests: 20, QuietPeriod: 30 * time.Second,
				ReducedFor: 10 * time.Second, CooldownFor: 20 * time.Second, BlockFor: 40 * time.Second, Idle: 15 * time.Second}
			rng := rand.New(rand.NewPCG(seed, 1))
			type batch struct {
				now   time.Time
				ds    []Decision
				lifts []Lift
			}
			var batches []batch
			now := start
			for range 400 {
				now = now.Add(time.Duration(rng.IntN(1500)) * time.Millisecond)
				b := batch{now: now}
				for range rng.IntN(40) {
					d := Decision{KeyID: fmt.Sprint("k", rng.IntN(4)), Tenant: "t", TimeMicros: now.Add(-time.Duration(rng.IntN(3000)) * time.Millisecond).UnixMicro(),
						Allowed: rng.IntN(3) == 0, Reason: "rate_limited"}
					if !d.Allowed {
						d.RetryAfter = int64(1 + rng.IntN(5))
					}
					if rng.IntN(50) == 0 {
						d.Reason = ReasonAllowlisted
					}
					b.ds = append(b.ds, d)
				}
				if rng.IntN(30) == 0 {
					b.lifts = append(b.lifts, Lift{KeyID: fmt.Sprint("k", rng.IntN(4)), TimeMicros: now.UnixMicro() - int64(rng.IntN(2_000_000))})
				}
				batches = append(batches, b)
			}
			apply := func(x *Txn, b batch) {
				for i := range b.ds {
					x.Observe(&b.ds[i], b.now)
				}
				for _, l := range b.lifts {
					x.Lift(l, b.now)
				}
				x.Evaluate(b.now)
				x.Tick(b.now)
			}
			ref := NewTable(cfg, 0, nil)
			var refSteps []Step
			for _, b := range batches {
				x := ref.Begin()
				apply(x, b)
				refSteps = append(refSteps, x.Steps()...)
				x.Commit()
			}
			tab := NewTable(cfg, 0, nil)
			var steps []Step
			for i, b := range batches {
				if rng.IntN(4) == 0 {
					x := tab.Begin()
					apply(x, b)
					_ = x.Changes() // produced, then the Kafka transaction aborts
				}
				x := tab.Begin()
				apply(x, b)
				changes := x.Changes()
				steps = append(steps, x.Steps()...)
				x.Commit()
				if i%37 == 36 {
					// A new owner rebuilds the table from the changelog.
					states := tab.states()
					for _, c := range changes {
						if c.Deleted {
							if _, ok := states[c.KeyID]; ok {
								t.Fatalf("deleted key %s still held", c.KeyID)
							}
						} else if states[c.KeyID] != c.State {
							t.Fatalf("change of %s differs from the committed state", c.KeyID)
						}
					}
					tab = NewTable(cfg, 0, states)
				}
			}
			if !reflect.DeepEqual(steps, refSteps) {
				t.Fatalf("steps differ from a run without aborts:\n%+v\n%+v", steps, refSteps)
			}
			if len(refSteps) == 0 {
				t.Fatal("the random run took no step: the test tests nothing")
			}
			for id, s := range ref.states() {
				if got, ok := tab.Get(id); !ok || got != s {
					t.Fatalf("state of %s differs: %+v, want %+v", id, got, s)
				}
			}
		})
	}
}

// TestTxnSizedFromTheLast (not parallel: it counts the process's
// allocations) checks that a transaction's map and slices start at the
// size of the last committed one: observing new keys allocates nothing
// (a key's state is a value in the transaction's slice), where a map and
// slices grown by doubling would allocate again at every doubling.
func TestTxnSizedFromTheLast(t *testing.T) {
	const keys = 4096
	tab := NewTable(Config{}, 0, nil)
	ids := testnet.Numbered("key-%06d", 2*keys)
	run := func(from int) (mallocs uint64) {
		x := tab.Begin()
		ds := make([]Decision, keys)
		for i := range ds {
			ds[i] = Decision{KeyID: ids[from+i], Tenant: "t", TimeMicros: start.UnixMicro(), Allowed: true}
		}
		mallocs = memtest.Mallocs(func() {
			for i := range ds {
				x.Observe(&ds[i], start)
			}
		})
		x.Commit()
		return mallocs
	}
	first := run(0) // the maps grow from empty
	second := run(keys)
	// A new key's state is a value in the transaction's slice: no
	// allocation of its own; growing the map and slice to 4096 keys is
	// dozens.
	if want := uint64(8); second > want {
		t.Errorf("second transaction of %d new keys: %d allocations, want at most %d (the first, unsized: %d)", keys, second, want, first)
	}
}

// states is every key's state the table holds.
func (t *Table) states() map[string]State {
	out := make(map[string]State, t.n)
	for id := 1; id < t.keys.IDs(); id++ {
		if t.slots.At(uint32(id)).live {
			var s State
			t.get(uint32(id), &s)
			out[t.keys.Str(uint32(id))] = s
		}
	}
	return out
}

// TestObserveBackoffWindow: a rejection with a Retry-After opens the
// window in which the key's further decisions are ignored (the client
// was told to wait); one after the window opens a new one, one that
// overlaps it widens it to the union, and one before the key's floor
// (a lift) changes nothing.
func TestObserveBackoffWindow(t *testing.T) {
	t.Parallel()
	const sec = int64(1_000_000)
	cfg := Config{}
	cfg.SetDefaults()
	for _, tt := range []struct {
		name                string
		from, until, floor  int64 // the state's window and floor before
		at, retryAfter      int64 // the decision's time (µs) and Retry-After (s)
		wantFrom, wantUntil int64
	}{
		{"first", 0, 0, 0, 10 * sec, 5, 10 * sec, 15 * sec},
		{"after the window: a new one", 10 * sec, 15 * sec, 0, 20 * sec, 5, 20 * sec, 25 * sec},
		{"overlapping: the union", 10 * sec, 15 * sec, 0, 12 * sec, 10, 10 * sec, 22 * sec},
		{"inside: unchanged", 10 * sec, 15 * sec, 0, 12 * sec, 1, 10 * sec, 15 * sec},
		{"no Retry-After: unchanged", 10 * sec, 15 * sec, 0, 20 * sec, 0, 10 * sec, 15 * sec},
		{"before the floor: unchanged", 0, 0, 30 * sec, 20 * sec, 5, 0, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := State{RetryFrom: tt.from, RetryUntil: tt.until, Floor: tt.floor}
			d := Decision{KeyID: "k", KeyPrefix: "sk_…", Tenant: "acme", TimeMicros: tt.at, RetryAfter: tt.retryAfter}
			cfg.observe(&s, &d, tt.at)
			if s.RetryFrom != tt.wantFrom || s.RetryUntil != tt.wantUntil {
				t.Fatalf("window [%d, %d), want [%d, %d)", s.RetryFrom, s.RetryUntil, tt.wantFrom, tt.wantUntil)
			}
			if s.KeyPrefix != "sk_…" || s.Tenant != "acme" || s.Touched != tt.at {
				t.Fatalf("state %+v: want the key's prefix, tenant and time kept", s)
			}
		})
	}
}
