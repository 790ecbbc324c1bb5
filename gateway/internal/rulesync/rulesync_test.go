package rulesync_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/compose/natsserver"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/gateway/internal/rulefile"
	"github.com/tollgate/tollgate/gateway/internal/rulesync"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

const rulesV1 = `
routes: ["/v1/users/{id}"]
rules:
  - id: default
    algorithm: token_bucket
    capacity: 10
    rate: 10/1m
`

// buckets is the control plane's side: the three buckets as the
// aggregator opens them, written directly (corrupt values too).
type buckets struct {
	t                       *testing.T
	c                       *fleetkv.Conn
	rules, lists, overrides jetstream.KeyValue
}

func createBuckets(t *testing.T, url string) *buckets {
	t.Helper()
	c, err := fleetkv.Connect(url, fleetkv.Options{Name: "test-writer", ReconnectWait: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	var kv *fleetkv.KV
	// Right after NATS comes back, JetStream may still be recovering.
	testwait.Eventually(t, 10*time.Second, func() error {
		kv, err = fleetkv.Open(t.Context(), c)
		return err
	})
	return &buckets{t: t, c: c, rules: kv.Rules, lists: kv.Lists, overrides: kv.Overrides}
}

func (b *buckets) put(kv jetstream.KeyValue, key string, v any) {
	b.t.Helper()
	raw, ok := v.([]byte)
	if !ok {
		var err error
		if raw, err = json.Marshal(v); err != nil {
			b.t.Fatal(err)
		}
	}
	// Right after NATS comes back, the writer's own connection may still
	// be reconnecting, or JetStream recovering: retry (a put whose answer
	// was lost may apply twice, which changes nothing here).
	testwait.Eventually(b.t, 10*time.Second, func() error {
		if !b.c.IsConnected() {
			return errors.New("writer not connected")
		}
		ctx, cancel := context.WithTimeout(b.t.Context(), time.Second)
		defer cancel()
		if _, err := kv.Put(ctx, key, raw); err != nil {
			return fmt.Errorf("put %s: %w", key, err)
		}
		return nil
	})
}

func (b *buckets) putRules(version int64, src string) {
	b.t.Helper()
	b.put(b.rules, tollgatev1.RulesKey, &tollgatev1.RulesEntry{Version: version, Source: src, Format: "yaml", Time: time.Now()})
}

func (b *buckets) del(kv jetstream.KeyValue, key string) {
	b.t.Helper()
	if err := kv.Delete(b.t.Context(), key); err != nil {
		b.t.Fatalf("delete %s: %v", key, err)
	}
}

// syncer is a Syncer running in the background, with what it applied.
type syncer struct {
	s        *rulesync.Syncer
	controls *guard.Controls
	logs     *testnet.Buffer
	refused  atomic.Int32
	changed  atomic.Int32 // OnCountersChanged calls
	lastSeen atomic.Value // OnCountersChanged's last arguments: counterChange
	mu       sync.Mutex
	applied  []*rulefile.Ruleset
	run      *testnet.Running
}

// counterChange is what OnCountersChanged was told.
type counterChange struct {
	reset bool
	names string // comma-joined
}

func newSyncer(t *testing.T, url, dir string) *syncer {
	t.Helper()
	return newSyncerWith(t, url, dir, func(*rulesync.Config) {})
}

// newSyncerWith is newSyncer with its Config changed by mutate.
func newSyncerWith(t *testing.T, url, dir string, mutate func(*rulesync.Config)) *syncer {
	t.Helper()
	sy := &syncer{controls: guard.NewControls(), logs: &testnet.Buffer{}}
	log := slog.New(slog.NewMultiHandler(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelInfo}),
		slog.NewTextHandler(sy.logs, nil)))
	cfg := rulesync.Config{
		URL: url, Name: "test", Dir: dir, Controls: sy.controls, Log: log,
		Apply: func(rs *rulefile.Ruleset) {
			sy.mu.Lock()
			defer sy.mu.Unlock()
			sy.applied = append(sy.applied, rs)
		},
		OnRefused: func(error) { sy.refused.Add(1) },
		OnCountersChanged: func(reset bool, names []string) {
			sy.lastSeen.Store(counterChange{reset: reset, names: strings.Join(names, ",")})
			sy.changed.Add(1)
		},
		ReconnectWait: 20 * time.Millisecond,
	}
	mutate(&cfg)
	var err error
	if sy.s, err = rulesync.New(cfg); err != nil {
		t.Fatal(err)
	}
	return sy
}

// bucketsV1 starts a NATS server with the fleet's buckets and rulesV1 in
// force as version 1.
func bucketsV1(t *testing.T) (*natsserver.Server, *buckets) {
	t.Helper()
	ns := natstest.StartTB(t)
	b := createBuckets(t, ns.ClientURL())
	b.putRules(1, rulesV1)
	return ns, b
}

// syncingV1 starts a NATS server with the fleet's buckets, rulesV1 in
// force as version 1, and a syncer running that has applied it.
func syncingV1(t *testing.T) (*natsserver.Server, *buckets, *syncer) {
	t.Helper()
	ns, b := bucketsV1(t)
	sy := newSyncer(t, ns.ClientURL(), t.TempDir())
	sy.start(t)
	sy.waitVersion(t, 1)
	return ns, b, sy
}

func (sy *syncer) start(t *testing.T) {
	sy.run = testnet.Start(t, "syncer", sy.s.Run)
}

// stop stops the syncer before the test ends; Run must return nil.
func (sy *syncer) stop(t *testing.T) {
	t.Helper()
	sy.run.StopNow(t)
}

// last returns the last ruleset applied, nil for none.
func (sy *syncer) last() *rulefile.Ruleset {
	sy.mu.Lock()
	defer sy.mu.Unlock()
	if len(sy.applied) == 0 {
		return nil
	}
	return sy.applied[len(sy.applied)-1]
}

// version returns the version of the last ruleset applied, 0 for none.
func (sy *syncer) version() int64 {
	if rs := sy.last(); rs != nil {
		return rs.Rules.Version()
	}
	return 0
}

func (sy *syncer) waitVersion(t *testing.T, v int64) {
	t.Helper()
	testwait.Eventually(t, 5*time.Second, func() error {
		if got := sy.version(); got != v {
			return fmt.Errorf("ruleset version %d applied, want %d", got, v)
		}
		return nil
	})
}

// waitControls waits until the controls hold what want says (a check
// returning nil).
func (sy *syncer) waitControls(t *testing.T, want func(*guard.ControlSet) error) {
	t.Helper()
	testwait.Eventually(t, 5*time.Second, func() error { return want(sy.controls.Snapshot()) })
}

func TestSyncAppliesEveryKind(t *testing.T) {
	t.Parallel()
	ns := natstest.StartTB(t)
	b := createBuckets(t, ns.ClientURL())
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Microsecond)
	b.putRules(7, rulesV1)
	b.put(b.lists, "kidBlocked", &tollgatev1.ListEntry{KeyID: "kidBlocked", Action: "block", Reason: "abuse", ExpiresAt: exp})
	b.put(b.lists, "kidPen2", &tollgatev1.ListEntry{KeyID: "kidPen2", Action: "penalty", Level: 2, Close: true, ExpiresAt: exp})
	b.put(b.lists, "kidPen3", &tollgatev1.ListEntry{KeyID: "kidPen3", Action: "penalty", Level: 3, Close: true})
	b.put(b.lists, "kidTop", &tollgatev1.ListEntry{KeyID: "kidTop", Action: "block", Level: 3, Close: true, ExpiresAt: exp})
	b.put(b.lists, "allow.kidAllowed", &tollgatev1.ListEntry{KeyID: "kidAllowed", Action: "allow"})
	b.put(b.lists, "kidMisplaced", &tollgatev1.ListEntry{KeyID: "kidOther", Action: "block"})
	b.put(b.lists, "kidGarbage", []byte("{not json"))
	b.put(b.overrides, "key.kidOv", &tollgatev1.OverrideEntry{Scope: "key", Subject: "kidOv", Limit: 50, Rule: "default"})
	b.put(b.overrides, "key.kidLadder1", &tollgatev1.OverrideEntry{Scope: "key", Subject: "kidLadder1", Factor: 0.5, Level: 1, ExpiresAt: exp})
	b.put(b.overrides, tollgatev1.OverrideKey("tenant", "acme corp"), &tollgatev1.OverrideEntry{Scope: "tenant", Subject: "acme corp", Factor: 0.5})

	dir := t.TempDir()
	sy := newSyncer(t, ns.ClientURL(), dir)
	sy.start(t)
	select {
	case <-sy.s.Synced():
	case <-time.After(5 * time.Second):
		t.Fatal("not synced within 5s")
	}
	if v := sy.version(); v != 7 {
		t.Fatalf("version %d applied, want 7 (the operator API's, not the document's)", v)
	}
	c := sy.controls.Snapshot()
	if e := c.Blocked["kidBlocked"]; e.Expiry != exp.UnixMicro() || e.Reason != "abuse" || e.Level != 0 || e.Close {
		t.Errorf("blocked entry %+v", e)
	}
	if e := c.Blocked["kidTop"]; e.Level != 3 || !e.Close || e.Expiry != exp.UnixMicro() {
		t.Errorf("the ladder's top level %+v: want a level 3 block with the connection-level answer", e)
	}
	if o := c.KeyOverrides["kidLadder1"]; o.Level != 1 || o.Factor != 0.5 {
		t.Errorf("the ladder's reduced limit %+v: want level 1", o)
	}
	if p := c.Penalties["kidPen2"]; p.Level != 2 || p.Close || p.Until != exp.UnixMicro() {
		t.Errorf("level 2 penalty %+v: want no connection-level answer below level 3", p)
	}
	if p := c.Penalties["kidPen3"]; p.Level != 3 || !p.Close || p.Until != math.MaxInt64 {
		t.Errorf("level 3 penalty %+v: want close, until lifted", p)
	}
	if _, ok := c.Allowed["kidAllowed"]; !ok || len(c.Allowed) != 1 {
		t.Errorf("allowlist %+v", c.Allowed)
	}
	if len(c.Blocked) != 2 {
		t.Errorf("blocklist %+v: the misplaced and undecodable entries must be ignored", c.Blocked)
	}
	if o := c.KeyOverrides["kidOv"]; o.Limit != 50 || o.Rule != "default" {
		t.Errorf("key override %+v", o)
	}
	if o := c.TenantOverrides["acme corp"]; o.Factor != 0.5 {
		t.Errorf("tenant override %+v", o)
	}
	if st := sy.s.Status(); !st.Connected || !st.Synced || st.LastApplied.IsZero() {
		t.Errorf("status %+v", st)
	}

	// Changes, one by one: each applied at once.
	gen := sy.controls.Generation()
	b.put(b.lists, "kidBlocked", &tollgatev1.ListEntry{KeyID: "kidBlocked", Action: "penalty", Level: 2, ExpiresAt: exp})
	sy.waitControls(t, func(c *guard.ControlSet) error {
		if _, blocked := c.Blocked["kidBlocked"]; blocked || c.Penalties["kidBlocked"].Level != 2 {
			return fmt.Errorf("kidBlocked: blocked %v, penalty %+v; want moved to a penalty", blocked, c.Penalties["kidBlocked"])
		}
		return nil
	})
	if g := sy.controls.Generation(); g != gen+1 {
		t.Errorf("moving a key from the blocklist to a penalty took %d generations, want 1 (atomic)", g-gen)
	}
	b.del(b.lists, "allow.kidAllowed")
	b.del(b.overrides, "key.kidOv")
	sy.waitControls(t, func(c *guard.ControlSet) error {
		if len(c.Allowed) != 0 || len(c.KeyOverrides) != 1 {
			return fmt.Errorf("allowlist %v, key overrides %v after their deletion", c.Allowed, c.KeyOverrides)
		}
		return nil
	})
	b.putRules(8, strings.Replace(rulesV1, "capacity: 10", "capacity: 20", 1))
	sy.waitVersion(t, 8)
	if p := sy.last().Routes; len(p) != 1 || p[0] != "/v1/users/{id}" {
		t.Errorf("routes %v did not travel with the ruleset", p)
	}

	// The copy on disk holds what is in force.
	testwait.Eventually(t, 5*time.Second, func() error {
		b, err := os.ReadFile(filepath.Join(dir, rulesync.LKGFile))
		if err != nil {
			return err
		}
		var f struct {
			Rules     tollgatev1.RulesEntry           `json:"rules"`
			Blocklist map[string]tollgatev1.ListEntry `json:"blocklist"`
			Overrides map[string]json.RawMessage      `json:"overrides"`
		}
		if err := json.Unmarshal(b, &f); err != nil {
			return err
		}
		if f.Rules.Version != 8 || f.Blocklist["kidBlocked"].Action != "penalty" || len(f.Overrides) != 2 {
			return fmt.Errorf("copy holds version %d, kidBlocked %q, %d overrides", f.Rules.Version, f.Blocklist["kidBlocked"].Action, len(f.Overrides))
		}
		return nil
	})
	if fi, err := os.Stat(filepath.Join(dir, rulesync.LKGFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("copy mode %v (%v), want 0600: the ruleset may name raw keys", fi.Mode(), err)
	}
}

func TestSyncRefusesAnInvalidRuleset(t *testing.T) {
	t.Parallel()
	ns, b, sy := syncingV1(t)

	b.putRules(2, "rules:\n  - id: bad\n    algorithm: token_bucket\n    capacity: 0\n    rate: 1/1s\n")
	testwait.Eventually(t, 5*time.Second, func() error {
		if sy.refused.Load() != 1 {
			return errors.New("not refused yet")
		}
		return nil
	})
	logs := sy.logs.String()
	for _, want := range []string{"ruleset from NATS refused", "version=2", "rule=bad", "field=capacity", "line=4"} {
		if !strings.Contains(logs, want) {
			t.Errorf("the refusal's log lacks %q:\n%s", want, logs)
		}
	}
	b.put(b.rules, tollgatev1.RulesKey, []byte("not json"))
	testwait.Eventually(t, 5*time.Second, func() error {
		if sy.refused.Load() != 2 {
			return errors.New("undecodable entry not refused yet")
		}
		return nil
	})
	if v := sy.version(); v != 1 {
		t.Fatalf("version %d in force, want 1: refused rulesets must not replace it", v)
	}
	// A resync reads the refused entry again: not counted twice.
	if err := ns.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	b.putRules(3, rulesV1+"# v3\n")
	sy.waitVersion(t, 3)
	if n := sy.refused.Load(); n != 2 {
		t.Errorf("%d refusals counted, want 2", n)
	}
}

// proxy is a TCP proxy in front of a NATS server that can cut the
// gateway off while the server keeps running: a network partition.
type proxy struct {
	ln     net.Listener
	target string
	cut    atomic.Bool
	mu     sync.Mutex
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startProxy(t *testing.T, target string) *proxy {
	t.Helper()
	ln := testnet.Listen(t)
	p := &proxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.drop()
		p.wg.Wait()
	})
	return p
}

// cutOff cuts the syncer's connection through p and keeps it cut (until
// p.cut is cleared), and waits until the syncer knows.
func (p *proxy) cutOff(t *testing.T, sy *syncer) {
	t.Helper()
	p.cut.Store(true)
	p.drop()
	testwait.Eventually(t, 5*time.Second, func() error {
		if sy.s.Status().Connected {
			return errors.New("still connected")
		}
		return nil
	})
}

func (p *proxy) url() string { return "nats://" + p.ln.Addr().String() }

func (p *proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		if p.cut.Load() {
			_ = c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(s, c); _ = s.Close() })
		p.wg.Go(func() { _, _ = io.Copy(c, s); _ = c.Close() })
	}
}

// drop closes every proxied connection.
func (p *proxy) drop() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// TestResyncAfterPartition cuts the gateway off NATS, changes and deletes
// entries meanwhile, and checks that the reconnect brings every change,
// deletions included, while the rules and controls in force stay during
// the partition.
func TestResyncAfterPartition(t *testing.T) {
	t.Parallel()
	ns, b := bucketsV1(t)
	b.put(b.lists, "kidA", &tollgatev1.ListEntry{KeyID: "kidA", Action: "block"})
	b.put(b.lists, "kidB", &tollgatev1.ListEntry{KeyID: "kidB", Action: "block"})
	p := startProxy(t, ns.Addr())
	sy := newSyncer(t, p.url(), t.TempDir())
	sy.start(t)
	sy.waitVersion(t, 1)
	sy.waitControls(t, func(c *guard.ControlSet) error {
		if len(c.Blocked) != 2 {
			return fmt.Errorf("blocklist %v", c.Blocked)
		}
		return nil
	})

	p.cutOff(t, sy)
	b.del(b.lists, "kidA")
	// No trace of kidA left, not even its delete marker (as after a
	// compaction): only reading the whole state shows it is gone.
	if err := b.lists.PurgeDeletes(t.Context(), jetstream.DeleteMarkersOlderThan(-1)); err != nil {
		t.Fatal(err)
	}
	b.put(b.lists, "kidC", &tollgatev1.ListEntry{KeyID: "kidC", Action: "block"})
	b.putRules(2, rulesV1+"# v2\n")
	if len(sy.controls.Snapshot().Blocked) != 2 || sy.version() != 1 {
		t.Fatal("the state in force changed during the partition")
	}

	p.cut.Store(false)
	took := testwait.Eventually(t, 5*time.Second, func() error {
		c := sy.controls.Snapshot()
		_, a := c.Blocked["kidA"]
		_, bb := c.Blocked["kidB"]
		_, cc := c.Blocked["kidC"]
		if a || !bb || !cc || sy.version() != 2 {
			return fmt.Errorf("after the partition: kidA %v kidB %v kidC %v version %d; want kidA gone, kidC in, version 2", a, bb, cc, sy.version())
		}
		return nil
	})
	t.Logf("state after the partition in force %v after the proxy let connections through again", took)
}

// TestReconnectAfterServerRestart: a change made after NATS comes back
// arrives at once (a kept watcher would be blind for 10-20 s).
func TestReconnectAfterServerRestart(t *testing.T) {
	t.Parallel()
	ns, b, sy := syncingV1(t)
	if err := ns.Down(); err != nil {
		t.Fatal(err)
	}
	if err := ns.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() error {
		if !sy.s.Status().Connected {
			return errors.New("not reconnected")
		}
		return nil
	})
	b.put(b.lists, "kidX", &tollgatev1.ListEntry{KeyID: "kidX", Action: "block"})
	start := time.Now()
	sy.waitControls(t, func(c *guard.ControlSet) error {
		if _, ok := c.Blocked["kidX"]; !ok {
			return errors.New("kidX not blocked")
		}
		return nil
	})
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("a change after the reconnect took %v, want < 2s", d)
	}
}

// TestStartFromLKG: a Syncer that cannot reach NATS starts from the copy
// its predecessor wrote, then follows NATS once it answers.
func TestStartFromLKG(t *testing.T) {
	t.Parallel()
	ns := natstest.StartTB(t, natsserver.WithStoreDir(t.TempDir()))
	b := createBuckets(t, ns.ClientURL())
	b.putRules(5, rulesV1)
	b.put(b.lists, "kidA", &tollgatev1.ListEntry{KeyID: "kidA", Action: "block"})
	dir := t.TempDir()
	first := newSyncer(t, ns.ClientURL(), dir)
	first.start(t)
	first.waitControls(t, func(c *guard.ControlSet) error {
		if len(c.Blocked) != 1 {
			return errors.New("kidA not blocked yet")
		}
		return nil
	})
	first.stop(t)
	if err := ns.Down(); err != nil {
		t.Fatal(err)
	}

	second := newSyncer(t, ns.ClientURL(), dir)
	lkg, err := second.s.LoadLKG()
	if err != nil || lkg == nil || lkg.Rules == nil {
		t.Fatalf("LoadLKG: %+v, %v", lkg, err)
	}
	if lkg.Rules.Rules.Version() != 5 || lkg.Entries != 1 {
		t.Fatalf("copy: version %d, %d entries; want 5 and 1", lkg.Rules.Rules.Version(), lkg.Entries)
	}
	if _, ok := second.controls.Snapshot().Blocked["kidA"]; !ok {
		t.Fatal("the copy's blocklist is not in force")
	}
	second.start(t)
	if second.s.Status().Connected {
		t.Fatal("connected to a server that is down")
	}
	if err := ns.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	b = createBuckets(t, ns.ClientURL())
	b.del(b.lists, "kidA")
	second.waitControls(t, func(c *guard.ControlSet) error {
		if len(c.Blocked) != 0 {
			return errors.New("kidA still blocked")
		}
		return nil
	})
	second.waitVersion(t, 5) // the same ruleset, now from NATS
}

// TestWaitsForBuckets: a gateway may start before the aggregator created
// the buckets; it follows them once they exist.
func TestWaitsForBuckets(t *testing.T) {
	t.Parallel()
	ns := natstest.StartTB(t)
	sy := newSyncer(t, ns.ClientURL(), t.TempDir())
	sy.start(t)
	testwait.Eventually(t, 5*time.Second, func() error {
		if !strings.Contains(sy.logs.String(), "does not exist yet") {
			return errors.New("no log line about the missing buckets")
		}
		return nil
	})
	b := createBuckets(t, ns.ClientURL())
	b.putRules(1, rulesV1)
	sy.waitVersion(t, 1)
	// Each problem is logged once, however often the Syncer retried
	// (the buckets appear one by one: up to one line each).
	for _, b := range []string{tollgatev1.BucketRules, tollgatev1.BucketBlocklist, tollgatev1.BucketOverrides} {
		if n := strings.Count(sy.logs.String(), "bucket "+b+" does not exist yet"); n > 1 {
			t.Errorf("the missing bucket %s was logged %d times, want once", b, n)
		}
	}
}

func TestNewRefusesIncompleteConfig(t *testing.T) {
	t.Parallel()
	_, err := rulesync.New(rulesync.Config{URL: "nats://127.0.0.1:4222"})
	if !errors.Is(err, rulesync.ErrConfig) || !strings.Contains(err.Error(), "Dir, Controls, Apply") {
		t.Fatalf("New: %v", err)
	}
}

// TestLadderLoggedOncePerKeyAndLevel: the log says once per key and level
// where the penalty ladder put a key (key_id and prefix, never the key),
// however often its entries are rewritten and across a resync.
func TestLadderLoggedOncePerKeyAndLevel(t *testing.T) {
	t.Parallel()
	ns, b := bucketsV1(t)
	exp := time.Now().Add(time.Hour).UTC()
	b.put(b.overrides, "key.kidLad", &tollgatev1.OverrideEntry{Scope: "key", Subject: "kidLad", KeyPrefix: "sk_ci_st…", Factor: 0.5, Level: 1, ExpiresAt: exp})
	// An operator's block is not the ladder's.
	b.put(b.lists, "kidOp", &tollgatev1.ListEntry{KeyID: "kidOp", Action: "block"})
	p := startProxy(t, ns.Addr())
	sy := newSyncer(t, p.url(), t.TempDir())
	sy.start(t)
	sy.waitVersion(t, 1)

	lines := func() []string {
		var out []string
		for l := range strings.Lines(sy.logs.String()) {
			if strings.Contains(l, "msg=\"key penal") {
				out = append(out, strings.TrimSpace(l[strings.Index(l, "msg="):]))
			}
		}
		return out
	}
	waitLines := func(want ...string) {
		t.Helper()
		testwait.Eventually(t, 5*time.Second, func() error {
			got := lines()
			if len(got) != len(want) {
				return fmt.Errorf("ladder lines %q, want %d", got, len(want))
			}
			for i, w := range want {
				if !strings.Contains(got[i], w) {
					return fmt.Errorf("line %d %q, want it to contain %q", i, got[i], w)
				}
			}
			return nil
		})
	}
	waitLines(`msg="key penalised" key_id=kidLad level=1 previous_level=0 key_prefix=sk_ci_st… action=reduced_limit`)

	// Level 2 replaces level 1; the same level rewritten says nothing. Each
	// write is waited for: the syncer may coalesce writes that arrive
	// together, and a level it never applied is rightly never logged.
	b.put(b.lists, "kidLad", &tollgatev1.ListEntry{KeyID: "kidLad", KeyPrefix: "sk_ci_st…", Action: "penalty", Level: 2, ExpiresAt: exp})
	b.del(b.overrides, "key.kidLad")
	waitLines(`level=1`, `msg="key penalised" key_id=kidLad level=2 previous_level=1 key_prefix=sk_ci_st… action=cooldown`)
	b.put(b.lists, "kidLad", &tollgatev1.ListEntry{KeyID: "kidLad", KeyPrefix: "sk_ci_st…", Action: "penalty", Level: 2, ExpiresAt: exp.Add(time.Minute)})
	sy.waitControls(t, func(c *guard.ControlSet) error {
		if p := c.Penalties["kidLad"]; p.Level != 2 || p.Until != exp.Add(time.Minute).UnixMicro() {
			return fmt.Errorf("kidLad penalty %+v, want the rewritten level 2", p)
		}
		return nil
	})
	b.put(b.lists, "kidLad", &tollgatev1.ListEntry{KeyID: "kidLad", KeyPrefix: "sk_ci_st…", Action: "block", Level: 3, Close: true, ExpiresAt: exp})
	waitLines(`level=1`, `level=2`,
		`msg="key penalised" key_id=kidLad level=3 previous_level=2 key_prefix=sk_ci_st… action=blocklist`)

	// The outbox's order: the old level's entry goes, then the new one
	// comes. One move, no end in between.
	b.put(b.overrides, "key.kidTwo", &tollgatev1.OverrideEntry{Scope: "key", Subject: "kidTwo", Factor: 0.5, Level: 1, ExpiresAt: exp})
	waitLines(`level=1`, `level=2`, `level=3`, `key_id=kidTwo level=1 previous_level=0`)
	b.del(b.overrides, "key.kidTwo")
	b.put(b.lists, "kidTwo", &tollgatev1.ListEntry{KeyID: "kidTwo", Action: "penalty", Level: 2, ExpiresAt: exp})
	waitLines(`level=1`, `level=2`, `level=3`, `key_id=kidTwo level=1`, `msg="key penalised" key_id=kidTwo level=2 previous_level=1`)
	// The two buckets are two streams, so the override's deletion may be
	// applied after the list entry's put; wait for it before the next step.
	sy.waitControls(t, func(c *guard.ControlSet) error {
		if o, ok := c.KeyOverrides["kidTwo"]; ok {
			return fmt.Errorf("kidTwo's level 1 override %+v still applied", o)
		}
		return nil
	})
	b.del(b.lists, "kidTwo")
	waitLines(`level=1`, `level=2`, `level=3`, `key_id=kidTwo level=1`, `key_id=kidTwo level=2`,
		`msg="key penalty ended" key_id=kidTwo level=0 previous_level=2`)

	// A resync with nothing new says nothing; one that finds the key gone
	// says it once.
	p.cutOff(t, sy)
	b.del(b.lists, "kidLad")
	p.cut.Store(false)
	waitLines(`level=1`, `level=2`, `level=3`, `kidTwo level=1`, `kidTwo level=2`, `kidTwo level=0`,
		`msg="key penalty ended" key_id=kidLad level=0 previous_level=3`)
	if strings.Contains(sy.logs.String(), "kidOp") {
		t.Error("an operator's block was logged as a ladder move")
	}
}

// TestCountersChangedReachTheGateway: the operator API's announcement of a
// reset or quota grant (tollgatev1.SubjectCounters) reaches
// OnCountersChanged, and still does after the gateway lost NATS and came
// back (core subscriptions are not KV watchers: nothing to read again).
func TestCountersChangedReachTheGateway(t *testing.T) {
	t.Parallel()
	ns, _ := bucketsV1(t)
	p := startProxy(t, ns.Addr())
	sy := newSyncer(t, p.url(), t.TempDir())
	sy.start(t)
	sy.waitVersion(t, 1)

	pub := natstest.Connect(t, ns.ClientURL())
	msg, _ := json.Marshal(tollgatev1.CountersChanged{Kind: tollgatev1.CountersReset, KeyID: "kidQ", Counters: []string{"tg{t}a", "tg{t}b"}, Time: time.Now()})
	// Core NATS drops a message no subscription is registered for yet:
	// announce until one arrives.
	heard := func(want int32) {
		t.Helper()
		testwait.Eventually(t, 5*time.Second, func() error {
			if n := sy.changed.Load(); n >= want {
				return nil
			}
			if err := pub.Publish(tollgatev1.SubjectCounters, msg); err != nil {
				return err
			}
			return fmt.Errorf("OnCountersChanged called %d times, want %d", sy.changed.Load(), want)
		})
	}
	heard(1)
	if got, _ := sy.lastSeen.Load().(counterChange); got != (counterChange{reset: true, names: "tg{t}a,tg{t}b"}) {
		t.Fatalf("OnCountersChanged told %+v, want the reset of the two counters", got)
	}

	p.cutOff(t, sy)
	p.cut.Store(false)
	testwait.Eventually(t, 5*time.Second, func() error {
		if !sy.s.Status().Connected {
			return errors.New("not connected again")
		}
		return nil
	})
	heard(sy.changed.Load() + 1)
}

// lkgVersion returns the ruleset version the copy in dir holds, 0 when
// there is none yet.
func lkgVersion(t *testing.T, dir string) int64 {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, rulesync.LKGFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Rules tollgatev1.RulesEntry `json:"rules"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("copy: %v", err)
	}
	return f.Rules.Version
}

// TestSaveIntervalCoalescesWrites: the changes of a burst are in force at
// once but reach the last-known-good copy as one write, SaveInterval after
// the previous one (a fleet on one disk otherwise fsyncs per gateway per
// change); the copy pending when Run returns is written then.
func TestSaveIntervalCoalescesWrites(t *testing.T) {
	t.Parallel()
	ns, b := bucketsV1(t)
	dir := t.TempDir()
	sy := newSyncerWith(t, ns.ClientURL(), dir, func(c *rulesync.Config) { c.SaveInterval = time.Hour })
	sy.start(t)
	sy.waitVersion(t, 1)
	testwait.Eventually(t, 5*time.Second, func() error {
		if v := lkgVersion(t, dir); v != 1 {
			return fmt.Errorf("copy holds version %d, want 1 (the first write is not delayed)", v)
		}
		return nil
	})
	for v := int64(2); v <= 5; v++ {
		b.putRules(v, strings.Replace(rulesV1, "capacity: 10", fmt.Sprintf("capacity: %d", 10*v), 1))
		sy.waitVersion(t, v)
	}
	// In force, not yet on disk: for a second (an unthrottled saver writes
	// within milliseconds), the copy stays at version 1.
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for end := time.Now().Add(time.Second); time.Now().Before(end); <-tick.C {
		if v := lkgVersion(t, dir); v != 1 {
			t.Fatalf("copy holds version %d within the save interval, want 1", v)
		}
	}
	sy.stop(t)
	if v := lkgVersion(t, dir); v != 5 {
		t.Fatalf("after Run returned the copy holds version %d, want 5 (the newest)", v)
	}
}

// documentOf is src parsed, in the form the operator API publishes it
// beside the source (RulesEntry.Document).
func documentOf(t *testing.T, src string) json.RawMessage {
	t.Helper()
	doc, err := rules.Parse([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	b, err := rules.EncodeDocument(doc)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestRulesetDocumentDecoded: a ruleset entry's Document is what the
// gateway decodes and puts in force (it does not parse the YAML source: an
// entry whose document says capacity 20 and whose source says 10 puts 20
// in force), with the source's hash; a document that does not decode or
// compile leaves the source to decide — put in force, or refused naming
// its rule, field and line.
func TestRulesetDocumentDecoded(t *testing.T) {
	t.Parallel()
	cap20 := strings.Replace(rulesV1, "capacity: 10", "capacity: 20", 1)
	bad := "rules:\n  - id: bad\n    algorithm: token_bucket\n    capacity: 0\n    rate: 1/1s\n"
	for _, tc := range []struct {
		name     string
		source   string
		document json.RawMessage
		capacity int64    // in force afterwards
		refused  []string // the refusal's log says each; nil: not refused
	}{
		{"document decoded", rulesV1, documentOf(t, cap20), 20, nil},
		{"document undecodable: the source", rulesV1, json.RawMessage(`{"rules":[{"id":"x","colour":1}]}`), 10, nil},
		{"document invalid: the source", rulesV1, documentOf(t, bad), 10, nil},
		{"both invalid: refused with the source's lines", bad, documentOf(t, bad), 10,
			[]string{"rule=bad", "field=capacity", "line=4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, b, sy := syncingV1(t)
			b.put(b.rules, tollgatev1.RulesKey, &tollgatev1.RulesEntry{Version: 2, Source: tc.source, Format: "yaml",
				Document: tc.document, Time: time.Now()})
			if tc.refused != nil {
				testwait.Eventually(t, 5*time.Second, func() error {
					if sy.refused.Load() != 1 {
						return errors.New("not refused yet")
					}
					return nil
				})
				for _, want := range tc.refused {
					if logs := sy.logs.String(); !strings.Contains(logs, want) {
						t.Errorf("the refusal's log lacks %q:\n%s", want, logs)
					}
				}
				if v := sy.version(); v != 1 {
					t.Fatalf("version %d in force after a refusal, want 1", v)
				}
				return
			}
			sy.waitVersion(t, 2)
			rs := sy.last()
			if got := rs.Rules.Rule("default").Params.Limit; got != tc.capacity {
				t.Errorf("capacity %d in force, want %d", got, tc.capacity)
			}
			sum := sha256.Sum256([]byte(tc.source))
			if rs.Rules.Hash() != hex.EncodeToString(sum[:]) {
				t.Errorf("hash %s, want the source's", rs.Rules.Hash())
			}
			if len(rs.Routes) != 1 || rs.Routes[0] != "/v1/users/{id}" {
				t.Errorf("routes %v", rs.Routes)
			}
			if n := sy.refused.Load(); n != 0 {
				t.Errorf("%d refusals, want none", n)
			}
		})
	}
}
