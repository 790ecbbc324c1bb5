package natsserver_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/compose/natsserver"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/testwait"
)

const waitTimeout = 10 * time.Second

// connect returns a connection that retries the server forever, every
// 20ms, closed at cleanup.
func connect(t *testing.T, s *natsserver.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(20 * time.Millisecond)}, opts...)
	return natstest.Connect(t, s.ClientURL(), opts...)
}

// bucket creates (or opens) the KV bucket "rules" with history 10.
func bucket(t *testing.T, nc *nats.Conn) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateOrUpdateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "rules", History: 10})
	if err != nil {
		t.Fatalf("create KV bucket: %v", err)
	}
	return kv
}

// next returns the next entry from w, failing the test after timeout.
func next(t *testing.T, w jetstream.KeyWatcher, timeout time.Duration) jetstream.KeyValueEntry {
	t.Helper()
	select {
	case e, ok := <-w.Updates():
		if !ok {
			t.Fatal("watcher closed")
		}
		return e
	case <-time.After(timeout):
		t.Fatalf("no watch update within %v", timeout)
		return nil
	}
}

func TestKVPutWatchLatency(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	s := natstest.StartTB(t)
	t.Logf("server with JetStream started in %v at %s", time.Since(t0), s.ClientURL())

	kv := bucket(t, connect(t, s))
	w, err := kv.Watch(t.Context(), "active", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	const n = 200
	lat := make([]time.Duration, n)
	for i := range n {
		v := "v" + strconv.Itoa(i)
		start := time.Now()
		rev, err := kv.PutString(t.Context(), "active", v)
		if err != nil {
			t.Fatal(err)
		}
		e := next(t, w, waitTimeout)
		lat[i] = time.Since(start)
		if e.Revision() != rev || string(e.Value()) != v {
			t.Fatalf("watch delivered revision %d %q, want %d %q", e.Revision(), e.Value(), rev, v)
		}
	}
	slices.Sort(lat)
	t.Logf("put→watch over %d puts (put acknowledged, then update received): p50 %v p90 %v p99 %v max %v",
		n, lat[n/2], lat[n*9/10], lat[n*99/100], lat[n-1])

	hist, err := kv.History(t.Context(), "active")
	if err != nil {
		t.Fatal(err)
	}
	if len(hist) != 10 || string(hist[9].Value()) != "v199" {
		t.Fatalf("history holds %d entries ending %q, want 10 ending v199", len(hist), hist[len(hist)-1].Value())
	}
}

func TestKVSurvivesRestart(t *testing.T) {
	t.Parallel()
	s := natstest.StartTB(t)
	nc := connect(t, s)
	kv := bucket(t, nc)
	for _, v := range []string{"r1", "r2", "r3"} {
		if _, err := kv.PutString(t.Context(), "active", v); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Now()
	if err := s.Restart(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Logf("restart took %v", time.Since(t0))

	check := func(kv jetstream.KeyValue) {
		t.Helper()
		hist, err := kv.History(t.Context(), "active")
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, e := range hist {
			got = append(got, string(e.Value()))
		}
		if want := []string{"r1", "r2", "r3"}; !slices.Equal(got, want) {
			t.Fatalf("history after restart %v, want %v", got, want)
		}
	}
	check(bucket(t, connect(t, s))) // a new client
	// The old client reconnects by itself.
	testwait.Eventually(t, waitTimeout, func() error {
		if !nc.IsConnected() {
			return fmt.Errorf("old connection is %v", nc.Status())
		}
		return nil
	})
	check(kv)
}

func TestStoreDirAcrossServers(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s1, err := natsserver.Start(t.Context(), natsserver.WithStoreDir(dir))
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(s1.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bucket(t, nc).PutString(t.Context(), "active", "kept"); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	if err := s1.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); err != nil {
		t.Fatalf("Stop removed a store dir it did not create: %v", err)
	}

	s2 := natstest.StartTB(t, natsserver.WithStoreDir(dir))
	e, err := bucket(t, connect(t, s2)).Get(t.Context(), "active")
	if err != nil || string(e.Value()) != "kept" {
		t.Fatalf("a new server on the same store dir: Get = %v, %v; want kept", e, err)
	}
}

// TestWatcherAcrossDownUp records what a client and its KV watchers do
// when the server goes away and comes back (the package doc sums it up).
func TestWatcherAcrossDownUp(t *testing.T) {
	t.Parallel()
	s := natstest.StartTB(t)
	reconnected := make(chan struct{}, 1)
	nc := connect(t, s, nats.ReconnectHandler(func(*nats.Conn) {
		select {
		case reconnected <- struct{}{}:
		default:
		}
	}))
	// A second client that does not buffer while disconnected.
	unbuffered := bucket(t, connect(t, s, nats.ReconnectBufSize(-1)))
	kv := bucket(t, nc)
	rev, err := kv.PutString(t.Context(), "active", "before")
	if err != nil {
		t.Fatal(err)
	}
	kept, err := kv.Watch(t.Context(), "active")
	if err != nil {
		t.Fatal(err)
	}
	defer kept.Stop()
	if e := next(t, kept, waitTimeout); e == nil || string(e.Value()) != "before" {
		t.Fatalf("first watch entry %v, want before", e)
	}
	if e := next(t, kept, waitTimeout); e != nil {
		t.Fatalf("want the end-of-initial-values marker (nil), got %v", e)
	}

	if err := s.Down(); err != nil {
		t.Fatal(err)
	}
	testwait.Eventually(t, waitTimeout, func() error {
		if nc.IsConnected() {
			return errors.New("client still connected")
		}
		return nil
	})
	// A put while down fails, but the default client keeps the message in
	// its reconnect buffer and sends it once reconnected: the put is
	// applied although the caller saw an error. With ReconnectBufSize(-1)
	// the put fails at once and is not applied.
	putDown := func(kv jetstream.KeyValue, v string) error {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		defer cancel()
		_, err := kv.PutString(ctx, "active", v)
		return err
	}
	if err := putDown(kv, "while-down"); err == nil {
		t.Fatal("put succeeded while the server was down")
	} else {
		t.Logf("put while down, default client: %v", err)
	}
	if err := putDown(unbuffered, "while-down-unbuffered"); err == nil {
		t.Fatal("unbuffered put succeeded while the server was down")
	} else {
		t.Logf("put while down, ReconnectBufSize(-1): %v", err)
	}

	t0 := time.Now()
	if err := s.Up(t.Context()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-reconnected:
	case <-time.After(waitTimeout):
		t.Fatal("client did not reconnect")
	}
	t.Logf("client reconnected %v after Up", time.Since(t0).Round(time.Millisecond))

	// The pattern for the gateway: on reconnect, a new watcher from the
	// revision after the last one applied.
	fresh, err := kv.Watch(t.Context(), "active", jetstream.ResumeFromRevision(rev+1))
	if err != nil {
		t.Fatal(err)
	}
	defer fresh.Stop()
	putAt := time.Now()
	if _, err := kv.PutString(t.Context(), "active", "after"); err != nil {
		t.Fatal(err)
	}
	want := []string{"while-down", "after"}
	var wg sync.WaitGroup
	var freshTook, keptTook time.Duration
	var freshGot, keptGot []string
	collect := func(w jetstream.KeyWatcher, took *time.Duration, got *[]string, timeout time.Duration) {
		ctx, cancel := context.WithTimeout(t.Context(), timeout)
		defer cancel()
		for len(*got) < len(want) {
			select {
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e != nil { // nil marks the end of initial values
					*got = append(*got, string(e.Value()))
				}
			case <-ctx.Done():
				return
			}
		}
		*took = time.Since(putAt)
	}
	wg.Go(func() { collect(fresh, &freshTook, &freshGot, waitTimeout) })
	wg.Go(func() { collect(kept, &keptTook, &keptGot, 30*time.Second) })
	wg.Wait()
	if !slices.Equal(freshGot, want) {
		t.Errorf("watcher recreated with ResumeFromRevision delivered %v, want %v", freshGot, want)
	}
	if !slices.Equal(keptGot, want) {
		t.Errorf("watcher kept across the outage delivered %v, want %v", keptGot, want)
	}
	t.Logf("a put after reconnect reached a recreated watcher in %v, the kept watcher in %v",
		freshTook.Round(time.Microsecond), keptTook.Round(time.Millisecond))
}

func TestLogger(t *testing.T) {
	t.Parallel()
	rec := &logtest.Recorder{}
	s := natstest.StartTB(t, natsserver.WithLogger(slog.New(rec)))
	connect(t, s)
	for _, line := range []string{"INFO nats-server started", "DEBUG Server is ready", "DEBUG ---------------- JETSTREAM ----------------"} {
		if !rec.Has(line) {
			t.Errorf("no log line %q", line)
		}
	}
	// At Info, one line says the server started; nats-server's own
	// start-up listing is Debug, and its ASCII-art banner is not logged
	// at all (make run's log stays readable).
	if n := rec.Count("INFO "); n != 1 {
		t.Errorf("%d Info lines after a start, want 1 (nats-server started)", n)
	}
	for _, art := range []string{"    _ ___ _____ ___ _____ ___ ___   _   __  __", "         https://docs.nats.io/jetstream"} {
		if rec.Has("DEBUG "+art) || rec.Has("INFO "+art) {
			t.Errorf("nats-server's banner line %q was logged", art)
		}
	}
	// Debug and trace lines reach the handler when it enables them.
	testwait.Eventually(t, waitTimeout, func() error {
		if rec.Count("DEBUG-4 ") == 0 {
			return errors.New("no trace line yet")
		}
		return nil
	})
}
