package fleetkv

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// announce runs an Announcer for gateway id on c until the returned stop
// is called, which waits for it.
func announce(t *testing.T, c *Conn, cfg AnnouncerConfig) (stop func()) {
	t.Helper()
	a, err := NewAnnouncer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.Run(ctx, c) })
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// seen returns the gateways kv's presence bucket holds, by id, and its
// corrupt entries' count.
func seen(t *testing.T, kv *KV) (map[string]GatewaySeen, int) {
	t.Helper()
	gs, corrupt, err := trySeen(t, kv)
	if err != nil {
		t.Fatal(err)
	}
	return gs, corrupt
}

// trySeen is seen that returns its error (NATS may be down).
func trySeen(t *testing.T, kv *KV) (map[string]GatewaySeen, int, error) {
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	gs, corrupt, err := kv.Gateways(ctx)
	out := map[string]GatewaySeen{}
	for _, g := range gs {
		out[g.Entry.GatewayID] = g
	}
	return out, len(corrupt), err
}

// TestAnnouncer: the entry is written at start with what Entry returns,
// again at once after a Poke, and deleted when Run returns.
func TestAnnouncer(t *testing.T) {
	t.Parallel()
	kv := openKV(t)
	var mu sync.Mutex
	version := int64(3)
	started := time.Now().UTC().Truncate(time.Second)
	a, err := NewAnnouncer(AnnouncerConfig{ID: "gw-a", Interval: time.Hour, Entry: func() tollgatev1.GatewayEntry {
		mu.Lock()
		defer mu.Unlock()
		return tollgatev1.GatewayEntry{Region: "eu", RulesVersion: version, RulesSource: tollgatev1.RulesFromNATS, StartedAt: started}
	}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.Run(ctx, kv.c) })
	defer func() { cancel(); wg.Wait() }()

	wantVersion := func(v int64) {
		t.Helper()
		testwait.Eventually(t, 2*time.Second, func() error {
			gs, _ := seen(t, kv)
			g, ok := gs["gw-a"]
			if !ok || g.Entry.RulesVersion != v {
				return fmt.Errorf("gateways %+v, want gw-a on version %d", gs, v)
			}
			if g.Entry.Region != "eu" || !g.Entry.StartedAt.Equal(started) || g.Entry.Time.IsZero() || g.Stored.IsZero() {
				return fmt.Errorf("entry %+v stored %v: fields missing", g.Entry, g.Stored)
			}
			return nil
		})
	}
	wantVersion(3)
	mu.Lock()
	version = 4
	mu.Unlock()
	a.Poke() // the interval is an hour: only the poke writes
	wantVersion(4)

	cancel()
	wg.Wait()
	if gs, _ := seen(t, kv); len(gs) != 0 {
		t.Fatalf("after Run returned: %+v, want no entry", gs)
	}
}

// TestAnnouncerPokeSpread: with PokeSpread, a poke's write waits its
// random delay (fixed here), so that the gateways of a fleet, which all
// put a ruleset in force at the same instant, do not all write then; the
// pokes that arrive meanwhile are served by the one write.
func TestAnnouncerPokeSpread(t *testing.T) {
	t.Parallel()
	kv := openKV(t)
	var mu sync.Mutex
	version := int64(1)
	a, err := NewAnnouncer(AnnouncerConfig{ID: "gw-s", Interval: time.Hour, PokeSpread: time.Hour, Entry: func() tollgatev1.GatewayEntry {
		mu.Lock()
		defer mu.Unlock()
		return tollgatev1.GatewayEntry{RulesVersion: version}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if d := a.delay(); d < 0 || d >= time.Hour {
		t.Fatalf("delay %v, want in [0, PokeSpread)", d)
	}
	const delay = 300 * time.Millisecond
	a.delay = func() time.Duration { return delay }
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.Run(ctx, kv.c) })
	defer func() { cancel(); wg.Wait() }()
	entry := func(v int64) GatewaySeen {
		t.Helper()
		var g GatewaySeen
		testwait.Eventually(t, 5*time.Second, func() error {
			gs, _ := seen(t, kv)
			var ok bool
			if g, ok = gs["gw-s"]; !ok || g.Entry.RulesVersion != v {
				return fmt.Errorf("gateways %+v, want gw-s on version %d", gs, v)
			}
			return nil
		})
		return g
	}
	first := entry(1) // the write at start is not delayed
	mu.Lock()
	version = 2
	mu.Unlock()
	poked := time.Now()
	a.Poke()
	a.Poke()
	g := entry(2)
	if g.Entry.Time.Before(poked.Add(delay)) {
		t.Errorf("written %v after the poke, want its delay (%v) or more", g.Entry.Time.Sub(poked), delay)
	}
	if g.Revision != first.Revision+1 {
		t.Errorf("revision %d after %d: two pokes while one was pending wrote more than once", g.Revision, first.Revision)
	}
}

// TestAnnouncerPokeEvery: with PokeEvery, pokes write at once until two
// writes they asked for come within PokeEvery of each other; the pokes
// after that are left to the heartbeat (an hour here) for PokeEvery or
// more: they write nothing.
func TestAnnouncerPokeEvery(t *testing.T) {
	t.Parallel()
	kv := openKV(t)
	var mu sync.Mutex
	version := int64(1)
	a, err := NewAnnouncer(AnnouncerConfig{ID: "gw-e", Interval: time.Hour, PokeEvery: time.Hour, Entry: func() tollgatev1.GatewayEntry {
		mu.Lock()
		defer mu.Unlock()
		return tollgatev1.GatewayEntry{RulesVersion: version}
	}})
	if err != nil {
		t.Fatal(err)
	}
	if q := a.quiet(); q < time.Hour || q >= 2*time.Hour {
		t.Fatalf("quiet %v, want in [PokeEvery, 2 PokeEvery)", q)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { a.Run(ctx, kv.c) })
	defer func() { cancel(); wg.Wait() }()
	entry := func(v int64) {
		t.Helper()
		testwait.Eventually(t, 5*time.Second, func() error {
			gs, _ := seen(t, kv)
			if g, ok := gs["gw-e"]; !ok || g.Entry.RulesVersion != v {
				return fmt.Errorf("gateways %+v, want gw-e on version %d", gs, v)
			}
			return nil
		})
	}
	set := func(v int64) {
		mu.Lock()
		version = v
		mu.Unlock()
	}
	entry(1) // written at start
	set(2)
	a.Poke() // written at once
	entry(2)
	set(3)
	a.Poke() // written at once too: one poke after another is no burst yet
	entry(3)
	set(4)
	a.Poke() // and a third (a gateway's start alone pokes twice)
	entry(4)
	w, err := kv.Presence.Watch(t.Context(), tollgatev1.GatewayKey("gw-e"), jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = w.Stop() }()
	set(5)
	a.Poke()
	set(6)
	a.Poke()
	select {
	case e := <-w.Updates():
		t.Fatalf("a poke within PokeEvery of the last poke's write wrote (revision %d)", e.Revision())
	case <-time.After(time.Second):
	}
}

// TestAnnouncerTTL: a gateway that stops without deleting its entry (its
// connection gone, as when it is killed) leaves the bucket by itself
// after the bucket's MaxAge.
func TestAnnouncerTTL(t *testing.T) {
	t.Parallel()
	ns := natstest.StartTB(t)
	reader, err := Connect(ns.ClientURL(), Options{Name: "reader"})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	const ttl = time.Second
	if _, err := OpenPresence(t.Context(), reader, ttl); err != nil {
		t.Fatal(err)
	}
	kv, err := Open(t.Context(), reader) // finds the bucket: its MaxAge stays
	if err != nil {
		t.Fatal(err)
	}
	gw, err := Connect(ns.ClientURL(), Options{Name: "gateway"})
	if err != nil {
		t.Fatal(err)
	}
	stop := announce(t, gw, AnnouncerConfig{ID: "gw-killed", Interval: 100 * time.Millisecond,
		Entry: func() tollgatev1.GatewayEntry { return tollgatev1.GatewayEntry{RulesSource: tollgatev1.RulesFromFile} }})
	testwait.Eventually(t, 2*time.Second, func() error {
		if gs, _ := seen(t, kv); len(gs) != 1 {
			return fmt.Errorf("gateways %+v, want gw-killed", gs)
		}
		return nil
	})
	gw.Close() // the connection dies first: the entry cannot be deleted
	stop()
	if gs, _ := seen(t, kv); len(gs) != 1 {
		t.Fatalf("right after the gateway died: %+v, want its entry still there", gs)
	}
	testwait.Eventually(t, ttl+5*time.Second, func() error {
		if gs, _ := seen(t, kv); len(gs) != 0 {
			return fmt.Errorf("gateways %+v, want none once the MaxAge has passed", gs)
		}
		return nil
	})
}

// TestAnnouncerNATSRestart: a NATS server that comes back without its
// store (the bucket gone) gets the bucket and the entry back at the next
// heartbeat; the failures meanwhile are logged once, and the recovery.
func TestAnnouncerNATSRestart(t *testing.T) {
	t.Parallel()
	ns := natstest.StartTB(t)
	gw, err := Connect(ns.ClientURL(), Options{Name: "gateway", ReconnectWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer gw.Close()
	rec := &logtest.Recorder{}
	announce(t, gw, AnnouncerConfig{ID: "gw-r", Interval: 100 * time.Millisecond, Log: rec.Logger(),
		Entry: func() tollgatev1.GatewayEntry { return tollgatev1.GatewayEntry{RulesSource: tollgatev1.RulesFromNATS} }})
	reader, err := Connect(ns.ClientURL(), Options{Name: "reader", ReconnectWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	var kv *KV
	testwait.Eventually(t, 2*time.Second, func() error {
		if kv, err = Open(t.Context(), reader); err != nil {
			return err
		}
		if gs, _ := seen(t, kv); len(gs) != 1 {
			return fmt.Errorf("gateways %+v, want gw-r", gs)
		}
		return nil
	})

	if err := ns.Down(); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 5*time.Second, func() error {
		if n := rec.Count("WARN presence heartbeat failed"); n == 0 {
			return fmt.Errorf("no failure logged yet")
		}
		return nil
	})
	if err := os.RemoveAll(ns.StoreDir()); err != nil {
		t.Fatal(err)
	}
	if err := ns.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, 10*time.Second, func() error {
		// The reader's bucket handle still names the bucket, which the
		// heartbeat creates anew.
		gs, _, err := trySeen(t, kv)
		if err != nil || len(gs) != 1 {
			return fmt.Errorf("gateways %+v (%v), want gw-r back", gs, err)
		}
		return nil
	})
	if n := rec.Count("WARN presence heartbeat failed"); n != 1 {
		t.Errorf("%d failure lines over the outage, want 1 (at most one a minute)", n)
	}
	testwait.Eventually(t, 2*time.Second, func() error {
		if !rec.Has("INFO presence heartbeat resumed") {
			return fmt.Errorf("the recovery is not logged")
		}
		return nil
	})
}

// TestGatewaysCorrupt: entries that do not decode or sit under another
// gateway's key are returned apart, counted, beside the good ones.
func TestGatewaysCorrupt(t *testing.T) {
	t.Parallel()
	kv := openKV(t)
	for key, value := range map[string]string{
		"gw-good":  `{"gateway_id":"gw-good","rules_version":2,"rules_source":"nats"}`,
		"gw-junk":  "\x00\x01not json",
		"gw-moved": `{"gateway_id":"gw-other","rules_version":2,"rules_source":"nats"}`,
		"gw-neg":   `{"gateway_id":"gw-neg","rules_version":-1}`,
	} {
		if _, err := kv.Presence.Put(t.Context(), key, []byte(value)); err != nil {
			t.Fatal(err)
		}
	}
	gs, corrupt := seen(t, kv)
	if len(gs) != 1 || gs["gw-good"].Entry == nil || corrupt != 3 {
		t.Fatalf("gateways %+v, %d corrupt; want gw-good and 3 corrupt", gs, corrupt)
	}
}

// TestCheckGatewayID: the gateway_ids that name a KV key, and those that
// do not.
func TestCheckGatewayID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		id string
		ok bool
	}{
		{"gw1", true}, {"eu-west-1.gw_3=a", true}, {"host-1234", true},
		{"", false}, {"gw 1", false}, {"gw:1", false}, {"gw*", false}, {"gw>", false}, {".gw", false}, {"gw.", false},
		{"gw..1", false}, {"gw/1", false}, {"gé", false}, {string(make([]byte, 257)), false},
	} {
		if err := tollgatev1.CheckGatewayID(tc.id); (err == nil) != tc.ok {
			t.Errorf("CheckGatewayID(%q) = %v, want ok %v", tc.id, err, tc.ok)
		}
	}
}
