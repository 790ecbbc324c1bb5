package aggregator_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// shortLadder is a ladder that runs in seconds.
func shortLadder() aggregator.PenaltyConfig {
	return aggregator.PenaltyConfig{Window: 2 * time.Second, BackoffMinIgnored: 20, BackoffMinShare: 0.5,
		RejectionMinRequests: 50, RejectionRatio: 0.9, ReducedFor: 4 * time.Second, CooldownFor: 4 * time.Second,
		BlockFor: 5 * time.Second, QuietPeriod: 3 * time.Second, Grace: 500 * time.Millisecond}
}

// penaltyStack is an aggregator with NATS, and a gateway deciding with
// the guard against a real redis-server, enforcing what the aggregator
// pushes to the KV buckets, and emitting its decisions into Kafka.
type penaltyStack struct {
	agg     *instance
	api     string
	brokers []string
	guard   *guard.Guard
	gw      *gateway
	hasher  *keyid.Hasher

	mu       sync.Mutex
	seen     []kvChange                // every change of the ladder's KV entries the gateway saw
	statuses map[string]map[string]int // key → reason → decisions
}

// kvChange is one change a gateway saw in the KV buckets.
type kvChange struct {
	at     time.Time
	bucket string
	keyID  string
	level  int
	action string // override, penalty, block, deleted
	close  bool
	factor float64
	step   uint64
	starts time.Time
}

func startPenaltyStack(t *testing.T, ladder aggregator.PenaltyConfig) *penaltyStack {
	brokers := startKafka(t)
	ns := natstest.StartTB(t)
	cfg := aggregator.Config{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", ID: "a", DataDir: t.TempDir(),
		AdminToken: token, KeySecret: secret, SessionTimeout: 2 * time.Second, Penalty: ladder}
	cfg.Kafka.Brokers = brokers
	cfg.Kafka.Partitions = partitions
	cfg.NATS.URL = ns.ClientURL()
	in := runWith(t, cfg, logtest.Verbose(t))
	srv := in.srv

	rs, err := rules.Load([]byte(`
rules:
  - id: per-key
    algorithm: token_bucket
    capacity: 20
    rate: 20/1s
`))
	if err != nil {
		t.Fatal(err)
	}
	redis := redistest.StartTB(t)
	client, err := redisstore.NewClient(redisstore.Config{Addrs: []string{redis.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	store := redisstore.New(client, redisstore.WithTimeout(time.Second))
	t.Cleanup(func() { _ = store.Close() })
	g, err := guard.New(store, []byte(secret), rs)
	if err != nil {
		t.Fatal(err)
	}
	hasher, err := keyid.New([]byte(secret))
	if err != nil {
		t.Fatal(err)
	}
	st := &penaltyStack{agg: in, api: srv.Addrs().API, brokers: brokers, guard: g, gw: newGateway(t, brokers, "gw-live", 1),
		hasher: hasher, statuses: map[string]map[string]int{}}
	st.watch(t, ns.ClientURL())
	return st
}

// watch applies the blocklist and overrides buckets to the guard's
// controls, as a gateway's watcher does, recording each change.
func (st *penaltyStack) watch(t *testing.T, url string) {
	js := natstest.JetStream(t, url)
	var lists, overrides jetstream.KeyValue
	testwait.Eventually(t, 30*time.Second, func() error {
		var err error
		if lists, err = js.KeyValue(context.Background(), tollgatev1.BucketBlocklist); err != nil {
			return err
		}
		overrides, err = js.KeyValue(context.Background(), tollgatev1.BucketOverrides)
		return err
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	c := st.guard.Controls()
	for _, kv := range []jetstream.KeyValue{lists, overrides} {
		w, err := kv.WatchAll(ctx)
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer func() { _ = w.Stop() }()
			for {
				var e jetstream.KeyValueEntry
				select {
				case <-ctx.Done():
					return
				case e = <-w.Updates():
				}
				if e == nil {
					continue // the initial values are in
				}
				ch := kvChange{at: time.Now(), bucket: e.Bucket(), action: "deleted"}
				switch {
				case e.Bucket() == tollgatev1.BucketOverrides:
					_, id, _ := tollgatev1.ParseOverrideKey(e.Key())
					ch.keyID = id
					if e.Operation() != jetstream.KeyValuePut {
						c.DeleteKeyOverride(id)
						break
					}
					o, err := tollgatev1.DecodeOverrideEntry(e.Value())
					if err != nil {
						t.Errorf("override %s: %v", e.Key(), err)
						continue
					}
					c.SetKeyOverride(id, guard.Override{Override: rules.Override{Factor: o.Factor, Limit: o.Limit, Expiry: o.ExpiresAt.UnixMicro()}})
					ch.action, ch.level, ch.factor, ch.step, ch.starts = "override", o.Level, o.Factor, o.Step, o.CreatedAt
				case strings.HasPrefix(e.Key(), "allow."):
					continue
				default:
					id := e.Key()
					ch.keyID = id
					if e.Operation() != jetstream.KeyValuePut {
						c.LiftPenalty(id)
						c.Unblock(id)
						break
					}
					l, err := tollgatev1.DecodeListEntry(e.Value())
					if err != nil {
						t.Errorf("blocklist %s: %v", e.Key(), err)
						continue
					}
					exp := int64(0)
					if !l.ExpiresAt.IsZero() {
						exp = l.ExpiresAt.UnixMicro()
					}
					if l.Action == tollgatev1.ActionPenalty {
						c.Unblock(id)
						c.SetPenalty(id, guard.Penalty{Level: l.Level, Until: exp, Close: l.Close, Reason: l.Reason})
					} else {
						c.LiftPenalty(id)
						c.Block(id, guard.Entry{Expiry: exp, Reason: l.Reason})
					}
					ch.action, ch.level, ch.close, ch.step, ch.starts = l.Action, l.Level, l.Close, l.Step, l.CreatedAt
				}
				st.mu.Lock()
				st.seen = append(st.seen, ch)
				st.mu.Unlock()
			}
		})
	}
}

// client sends requests for key until stop is closed: one every
// millisecond, and a polite one waits out every Retry-After first.
func (st *penaltyStack) client(t *testing.T, key string, polite bool) (stop func()) {
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			d, err := st.guard.Check(context.Background(), &guard.Request{Key: key, Path: "/v1/x", Method: "GET"})
			if err != nil {
				t.Errorf("check: %v", err)
				return
			}
			st.record(t, d)
			wait := time.Millisecond
			if polite && d.RetryAfter > 0 {
				wait = time.Duration(d.RetryAfter) * time.Second // as a client honouring Retry-After
			}
			select {
			case <-quit:
				return
			case <-time.After(wait):
			}
		}
	}()
	var once sync.Once
	stop = func() { once.Do(func() { close(quit); <-done }) }
	t.Cleanup(stop)
	return stop
}

// record emits a decision as a gateway's event producer does.
func (st *penaltyStack) record(t *testing.T, d *guard.Decision) {
	at := d.Time
	if at == 0 {
		at = time.Now().UnixMicro() // decided without Redis: the gateway's clock
	}
	ev := &tollgatev1.DecisionEvent{TimeUnixMicros: at, Kind: tollgatev1.DecisionEvent_KIND_DECISION, KeyId: d.KeyID,
		KeyPrefix: d.KeyPrefix, Tenant: d.Tenant, Tier: d.Tier, Endpoint: d.Endpoint, Method: "GET", Allowed: d.Allowed,
		Reason: string(d.Reason), Status: int32(d.Status), RetryAfterSeconds: d.RetryAfter, PenaltyLevel: int32(d.PenaltyLevel)}
	if d.Allowed {
		ev.Cost = 1
	}
	if r := d.DecidingRule(); r != nil {
		ev.RuleId, ev.Algorithm, ev.Remaining = r.ID, string(r.Algorithm), r.Remaining
	}
	st.gw.send(t, ev)
	st.mu.Lock()
	if st.statuses[d.KeyID] == nil {
		st.statuses[d.KeyID] = map[string]int{}
	}
	st.statuses[d.KeyID][string(d.Reason)]++
	st.mu.Unlock()
}

// penaltyAnswer is GET /admin/v1/penalties/{key}.
type penaltyAnswer struct {
	Key       string     `json:"key"`
	KeyID     string     `json:"key_id"`
	Tenant    string     `json:"tenant"`
	Level     int        `json:"level"`
	Action    string     `json:"action"`
	ExpiresAt *time.Time `json:"expires_at"`
	Step      uint64     `json:"step"`
	Partition *int32     `json:"partition"`
	History   []struct {
		Time     string            `json:"time"`
		Level    int               `json:"level"`
		Previous int               `json:"previous_level"`
		Change   string            `json:"change"`
		Actor    string            `json:"actor"`
		Reason   string            `json:"reason"`
		Evidence []json.RawMessage `json:"evidence"`
	} `json:"history"`
}

func (a penaltyAnswer) changes() []string {
	var out []string
	for _, h := range a.History {
		out = append(out, fmt.Sprintf("%s→%d", h.Change, h.Level))
	}
	return out
}

func getPenalty(t *testing.T, addr, key string) (penaltyAnswer, error) {
	code, _, b := op(t, addr, "GET", "/admin/v1/penalties/"+key, "")
	var a penaltyAnswer
	if code != 200 {
		return a, fmt.Errorf("GET penalties: %d %s", code, b)
	}
	return a, json.Unmarshal(b, &a)
}

// waitChanges waits until the key's history is exactly want.
func waitChanges(t *testing.T, addr, key string, timeout time.Duration, want ...string) penaltyAnswer {
	t.Helper()
	return waitHistory(t, addr, key, timeout, fmt.Sprint(want), func(got []string) bool { return slices.Equal(got, want) })
}

// waitClimbed waits until key's history begins with want, and returns
// it: a client still abusing when the test stops it may have climbed a
// step further, which a slow machine shows often enough to matter.
func waitClimbed(t *testing.T, addr, key string, timeout time.Duration, want ...string) penaltyAnswer {
	t.Helper()
	return waitHistory(t, addr, key, timeout, fmt.Sprint(want, "..."), func(got []string) bool {
		return len(got) >= len(want) && slices.Equal(got[:len(want)], want)
	})
}

// waitHistory waits until key's history satisfies match and the state
// shows its last step.
func waitHistory(t *testing.T, addr, key string, timeout time.Duration, want string, match func([]string) bool) penaltyAnswer {
	t.Helper()
	var a penaltyAnswer
	took := testwait.Eventually(t, timeout, func() error {
		var err error
		if a, err = getPenalty(t, addr, key); err != nil {
			return err
		}
		got := a.changes()
		if !match(got) {
			return fmt.Errorf("history %v, want %s", got, want)
		}
		// The state and the audit log are materialized from two topics:
		// wait for the state to show the last step too.
		if a.Step != uint64(len(got)) {
			return fmt.Errorf("history %v, state at step %d", got, a.Step)
		}
		return nil
	})
	t.Logf("%s: history %v after %v", key, a.changes(), took)
	return a
}

// ladderLevels are the KV changes of a key climbing the whole ladder:
// its override at level 1, its penalty at 2, its block at 3.
var ladderLevels = []string{"override1", "penalty2", "block3"}

// isSubsequence reports whether sub is seq with some elements left out.
func isSubsequence(sub, seq []string) bool {
	i := 0
	for _, s := range seq {
		if i < len(sub) && sub[i] == s {
			i++
		}
	}
	return i == len(sub)
}

// TestPenaltyLadderEndToEnd: a client ignoring Retry-After climbs level
// 1 → 2 → 3, each step reaching the gateway through KV; one honouring it
// never climbs; once the storm stops the levels step down to 0 after the
// quiet periods; every step is in the audit log with its evidence.
func TestPenaltyLadderEndToEnd(t *testing.T) {
	st := startPenaltyStack(t, shortLadder())
	storm, polite := "sk_ci_storm", "sk_ci_polite"
	stormID, politeID := st.hasher.ID(storm), st.hasher.ID(polite)
	stopStorm := st.client(t, storm, false)
	stopPolite := st.client(t, polite, true)

	a := waitChanges(t, st.api, storm, 60*time.Second, "reduced_limit→1", "cooldown→2", "blocklist→3")
	if a.Level != 3 || a.Action != "blocklist" || a.ExpiresAt == nil || a.Key != "kid:"+stormID || a.Tenant != stormID {
		t.Fatalf("at the top: %+v", a)
	}
	for i, h := range a.History {
		if len(h.Evidence) == 0 || h.Actor == "" || h.Reason == "" || h.Previous != i {
			t.Errorf("step %d without its evidence, actor or reason: %+v", i, h)
		}
	}
	// Each level reached the gateway through KV, and the gateway enforced
	// it: PENALTY 429s at level 2, 403s at level 3.
	testwait.Eventually(t, 10*time.Second, func() error {
		st.mu.Lock()
		defer st.mu.Unlock()
		var levels []string
		for _, c := range st.seen {
			if c.keyID == stormID && c.action != "deleted" {
				levels = append(levels, fmt.Sprintf("%s%d", c.action, c.level))
				if lag := c.at.Sub(c.starts); lag > 2*time.Second {
					t.Logf("level %d reached the gateway %v after the step (the propagation bound: < 2 s)", c.level, lag)
				}
			}
		}
		// A watcher that falls behind on a loaded machine may find a
		// level already replaced by the next (the bucket keeps the latest
		// value of each key), and one that restarts sees the latest again:
		// the levels it saw climb in order and end at the top.
		levels = slices.Compact(levels)
		if !isSubsequence(levels, ladderLevels) || len(levels) == 0 || levels[len(levels)-1] != "block3" {
			return fmt.Errorf("KV changes seen by the gateway: %v, want %v (or the levels of it still there when read)", levels, ladderLevels)
		}
		n := st.statuses[stormID]
		if n["blocklisted"] == 0 || slices.Contains(levels, "penalty2") && n["penalty"] == 0 {
			return fmt.Errorf("storm decisions %v with KV changes %v: want 403s, and PENALTY 429s once level 2 was seen", n, levels)
		}
		if len(levels) < len(ladderLevels) {
			t.Logf("the gateway's watcher saw %v: a level was replaced before it read it", levels)
		}
		return nil
	})
	st.mu.Lock()
	for _, c := range st.seen {
		if c.keyID == stormID && c.action != "deleted" {
			t.Logf("KV %s level %d (close %v, factor %v) at the gateway %v after the step", c.action, c.level, c.close, c.factor, c.at.Sub(c.starts))
			if c.level == 3 && !c.close {
				t.Error("level 3 without close")
			}
			if c.level == 1 && c.factor != 0.5 {
				t.Errorf("level 1 factor %v", c.factor)
			}
		}
	}
	st.mu.Unlock()

	stopStorm()
	a = waitChanges(t, st.api, storm, 60*time.Second, "reduced_limit→1", "cooldown→2", "blocklist→3",
		"step_down→2", "step_down→1", "step_down→0")
	if a.Level != 0 || a.Action != "none" {
		t.Fatalf("after the quiet periods: %+v", a)
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		st.mu.Lock()
		defer st.mu.Unlock()
		for i := len(st.seen) - 1; i >= 0; i-- {
			if c := st.seen[i]; c.keyID == stormID {
				if c.action != "deleted" {
					return fmt.Errorf("the gateway's last change of the storm key: %+v", c)
				}
				return nil
			}
		}
		return errors.New("no change")
	})

	stopPolite()
	p, err := getPenalty(t, st.api, polite)
	if err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	politeDecisions := st.statuses[politeID]
	st.mu.Unlock()
	if p.Level != 0 || len(p.History) != 0 || politeDecisions["rate_limited"] == 0 {
		t.Fatalf("the polite client (decisions %v): %+v, want level 0, no history, and some 429s honoured", politeDecisions, p)
	}

	// The audit log holds every step with its evidence.
	code, _, b := op(t, st.api, "GET", "/admin/v1/audit?kind=penalty&key=kid:"+stormID, "")
	if code != 200 || strings.Count(string(b), `"kind": "penalty"`) != 6 || !strings.Contains(string(b), `"detector": "backoff_ignored"`) {
		t.Fatalf("audit: %d %s", code, b)
	}
	// The metrics count the steps, never naming a key.
	metrics := scrape(t, st.agg.srv.Addrs().Metrics)
	for _, want := range []string{`tollgate_aggregator_penalties_total{action="blocklist",aggregator="a",level="3"} 1`,
		`tollgate_aggregator_detector_firings_total{aggregator="a",detector="backoff_ignored"}`,
		`tollgate_aggregator_volume_ceiling_keys{aggregator="a"} 0`, `tollgate_aggregator_penalized_keys{aggregator="a",level="3"} 0`,
		`tollgate_aggregator_outbox_events_total{aggregator="a",result="applied"}`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("metrics lack %s", want)
		}
	}
	if strings.Contains(metrics, stormID) {
		t.Error("a key_id in the metrics")
	}
}

func scrape(t *testing.T, addr string) string {
	t.Helper()
	code, _, b := op(t, addr, "GET", "/metrics", "")
	if code != 200 {
		t.Fatalf("metrics: %d", code)
	}
	return string(b)
}

// TestPenaltyLift: an operator lifts a penalised key; the level and the
// evidence reset, the KV entries go, the lift is audited with its actor,
// and decisions made before the lift never count towards a new penalty —
// while new abuse climbs again from level 1.
func TestPenaltyLift(t *testing.T) {
	ladder := shortLadder()
	ladder.ReducedFor, ladder.CooldownFor, ladder.BlockFor, ladder.QuietPeriod = time.Hour, time.Hour, time.Hour, time.Hour
	st := startPenaltyStack(t, ladder)
	key := "sk_lift_me"
	id := st.hasher.ID(key)
	stop := st.client(t, key, false)
	waitClimbed(t, st.api, key, 60*time.Second, "reduced_limit→1", "cooldown→2")
	stop()
	before := time.Now()

	if code, _, b := op(t, st.api, "DELETE", "/admin/v1/penalties/kid:nobody-has-this-key000", ""); code != 404 {
		t.Fatalf("lift of a key without state: %d %s", code, b)
	}
	liftAt := time.Now()
	code, _, b := op(t, st.api, "DELETE", "/admin/v1/penalties/"+key+"?reason=fixed+their+client", "", "X-Tollgate-Actor", "alice")
	if code != 200 {
		t.Fatalf("DELETE: %d %s", code, b)
	}
	var a penaltyAnswer
	if err := json.Unmarshal(b, &a); err != nil || a.Level != 0 || a.Action != "none" {
		t.Fatalf("after the lift: %+v %v", a, err)
	}
	// The lift is the last step; the client may have climbed past the
	// cooldown before it stopped.
	a = waitHistory(t, st.api, key, 20*time.Second, "[reduced_limit→1 cooldown→2 ... lifted→0]", func(got []string) bool {
		return len(got) >= 3 && slices.Equal(got[:2], []string{"reduced_limit→1", "cooldown→2"}) && got[len(got)-1] == "lifted→0"
	})
	lifted := a.changes()
	if h := a.History[len(lifted)-1]; h.Actor != "alice" || h.Reason != "fixed their client" {
		t.Fatalf("the lift's audit entry: %+v", h)
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		st.mu.Lock()
		defer st.mu.Unlock()
		for _, c := range st.seen {
			if c.keyID == id && c.bucket == tollgatev1.BucketBlocklist && c.action == "deleted" && c.at.After(liftAt) {
				return nil
			}
		}
		return errors.New("the gateway has not seen the key's cooldown deleted")
	})
	if d, _ := st.guard.Check(context.Background(), &guard.Request{Key: key, Path: "/v1/x"}); d.Reason == guard.ReasonPenalty {
		t.Fatal("the gateway still penalises the lifted key")
	}

	// Decisions made before the lift, delivered after it (a gateway's
	// spool replay), never count: 500 ignored Retry-Afters.
	for i := range 500 {
		at := before.Add(-time.Duration(500-i) * time.Millisecond)
		st.gw.send(t, &tollgatev1.DecisionEvent{TimeUnixMicros: at.UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_DECISION,
			KeyId: id, Tenant: id, Endpoint: "/v1/x", Allowed: false, Reason: "rate_limited", Status: 429, RetryAfterSeconds: 5})
	}
	// A marker behind them in the same partition: once it is counted, so
	// were they.
	st.gw.send(t, &tollgatev1.DecisionEvent{TimeUnixMicros: time.Now().UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_DECISION,
		KeyId: id, Tenant: id, Endpoint: "/v1/marker", Allowed: true, Cost: 1, Reason: "allowed", Status: 200})
	testwait.Eventually(t, 30*time.Second, func() error {
		r, err := report(t, st.api, id)
		if err != nil {
			return err
		}
		for _, row := range r.Rows {
			if row["endpoint"] == "/v1/marker" {
				return nil
			}
		}
		return errors.New("marker not counted yet")
	})
	if a, _ = getPenalty(t, st.api, key); a.Level != 0 || len(a.History) != len(lifted) {
		t.Fatalf("decisions made before the lift counted: %+v", a)
	}

	// New abuse climbs again, from level 1.
	st.client(t, key, false)
	waitChanges(t, st.api, key, 60*time.Second, append(lifted, "reduced_limit→1")...)
}

// TestAllowlistLiftsPenalty: allowlisting a penalised key lifts it.
func TestAllowlistLiftsPenalty(t *testing.T) {
	ladder := shortLadder()
	ladder.ReducedFor, ladder.CooldownFor, ladder.BlockFor, ladder.QuietPeriod = time.Hour, time.Hour, time.Hour, time.Hour
	st := startPenaltyStack(t, ladder)
	key := "sk_soon_vip"
	stop := st.client(t, key, false)
	climbed := waitClimbed(t, st.api, key, 60*time.Second, "reduced_limit→1").changes()
	stop()
	if code, _, b := op(t, st.api, "PUT", "/admin/v1/allowlist/"+key, `{"reason":"partner"}`); code != 200 {
		t.Fatalf("allowlist: %d %s", code, b)
	}
	a := waitHistory(t, st.api, key, 30*time.Second, fmt.Sprint(climbed, " ... lifted→0"), func(got []string) bool {
		return len(got) > len(climbed) && slices.Equal(got[:len(climbed)], climbed) && got[len(got)-1] == "lifted→0"
	})
	if a.Level != 0 {
		t.Fatalf("%+v", a)
	}
}
