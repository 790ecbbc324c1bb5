package failuretest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/breaker"
	"github.com/tollgate/tollgate/guard/redisstore"
)

func loadReq(w, _ int) guard.Request {
	return guard.Request{Key: fmt.Sprintf("load-%d", w), Path: "/load"}
}

// warm waits until the load has made some normal decisions.
func warm(t *testing.T, l *load) {
	t.Helper()
	until(t, 10*time.Second, "normal decisions before the fault", func() bool { return l.normal[0].Load() >= 200 })
}

// TestRedisKilled: redis-server SIGKILLed under load. Every check is
// answered within its deadline; once the breaker is open checks are
// answered without any Redis call but the breaker's probes, `on_failure:
// closed` rules are limited locally with failure_share of their limit, and
// after a restart (empty) normal limiting resumes by itself with every
// counter full again.
func TestRedisKilled(t *testing.T) {
	srv := redistest.StartTB(t)
	r := newRig(t, redisstore.Config{Addrs: []string{srv.Addr()}})
	ctx := context.Background()

	small := guard.Request{Key: "small-key", Path: "/small"}
	for i := range 6 {
		if d := r.check(t, small); d.Allowed != (i < 5) || d.Degraded {
			t.Fatalf("small check %d before the fault: %+v", i, d)
		}
	}
	l := startLoad(t, r, loadReq, nil)
	warm(t, l)

	// Phase 1: killed, until the breaker opens.
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	killed := l.next(1)
	toOpen := until(t, 5*time.Second, "breaker open", func() bool { return r.breakerState("") == breaker.Open })

	// Phase 2: open. Only probes reach Redis.
	l.next(2)
	calls0, probes0 := r.store.Calls(), r.halfOpens.Load()
	// on_failure: closed, capacity 8, failure_share 0.25: 2 admitted.
	admitted := 0
	for i := range 20 {
		d := r.check(t, guard.Request{Key: "strict-key", Path: "/strict"})
		if !d.Degraded || d.Reason != guard.ReasonRedisUnavailable && d.Allowed {
			t.Fatalf("strict check %d during the outage: %+v", i, d)
		}
		if rr := d.DecidingRule(); rr.FailOpen || rr.Limit != 8 {
			t.Fatalf("strict rule during the outage: %+v", rr)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 2 {
		t.Fatalf("on_failure closed admitted %d of 20 locally, want 2 (8 × 0.25)", admitted)
	}
	// Fail open: allowed, remaining -1.
	if d := r.check(t, small); !d.Allowed || !d.Degraded || d.DecidingRule().Remaining != -1 || !d.DecidingRule().FailOpen {
		t.Fatalf("fail-open check during the outage: %+v", d)
	}
	until(t, 10*time.Second, "two probes while open", func() bool {
		return r.halfOpens.Load()-probes0 >= 2 && l.degraded[2].Load() >= 1000
	})
	calls, probes := r.store.Calls()-calls0, r.halfOpens.Load()-probes0
	degradedWhileOpen := l.degraded[2].Load()
	// A worker's call let through just before the breaker opened may
	// still be on its way to the batcher: at most one per worker.
	if calls > probes+workers {
		t.Errorf("%d scripts sent while open for %d degraded checks; %d probes", calls, degradedWhileOpen, probes)
	}

	// Phase 3: restarted, empty.
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	back := l.next(3)
	recovery := l.untilNormal(t, recoverBound, "normal limiting after the restart", 3, back)
	st := l.assertAnswered(t, 1, 2, 3)
	if recovery > recoverBound {
		t.Errorf("normal limiting %v after the restart, bound %v", recovery, recoverBound)
	}
	// Restarted empty: the exhausted counter is full again.
	for i := range 6 {
		if d := r.check(t, small); d.Allowed != (i < 5) || d.Degraded {
			t.Fatalf("small check %d after the empty restart: %+v", i, d)
		}
	}
	var degraded int64
	for p := range maxPhases {
		degraded += l.degraded[p].Load()
	}
	if n := r.degradedHook.Load(); n != degraded+21 {
		t.Errorf("degraded hook called %d times for %d degraded decisions", n, degraded+21)
	}

	t.Logf("figure: SIGKILL under load (%d workers, call deadline %v): breaker open %v after the kill", workers, callDeadline, toOpen.Round(time.Millisecond))
	t.Logf("figure: SIGKILL: checks until the breaker opened: %v", st[0])
	t.Logf("figure: SIGKILL: degraded checks while open (no Redis call): %v; %d scripts sent (%d probes)", st[1], calls, probes)
	t.Logf("figure: SIGKILL: restart (empty) -> normal limiting in %v; checks meanwhile %v", recovery.Round(time.Millisecond), st[2])
	t.Logf("figure: SIGKILL: outage lasted %v in all", time.Since(killed).Round(time.Millisecond))
}

// TestRedisHung: redis-server SIGSTOPped (hanging, not refusing) under
// load. Deadlines hold; after SIGCONT normal limiting resumes by itself,
// and no check was charged twice: Redis holds at least the admissions the
// guard reported as charged and at most one unit per script sent (a
// timed-out script may have run once, never twice). Then a restart (empty)
// under load: normal limiting again.
func TestRedisHung(t *testing.T) {
	srv := redistest.StartTB(t)
	r := newRig(t, redisstore.Config{Addrs: []string{srv.Addr()}})
	ctx := context.Background()
	l := startLoad(t, r, loadReq, nil)
	warm(t, l)

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	paused := l.next(1)
	toOpen := until(t, 5*time.Second, "breaker open", func() bool { return r.breakerState("") == breaker.Open })
	l.next(2)
	// Resume just after a probe timed out and the breaker reopened: the
	// worst case, a whole open period to wait.
	opens0 := r.opens.Load()
	until(t, 10*time.Second, "three probes timing out", func() bool { return r.opens.Load()-opens0 >= 3 })

	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed := l.next(3)
	stopped := resumed.Sub(paused)
	recovery := l.untilNormal(t, recoverBound, "normal limiting after SIGCONT", 3, resumed)
	st := l.assertAnswered(t, 1, 2, 3)
	if recovery > recoverBound {
		t.Errorf("normal limiting %v after SIGCONT, bound %v", recovery, recoverBound)
	}

	// Charged at most once.
	sent := r.store.Calls()
	var charged, held int64
	for w := range workers {
		req := loadReq(w, 0)
		charged += l.charged[req.Key+" "+req.Path]
		held += r.peekUsed(t, req)
	}
	if held < charged || held > sent {
		t.Errorf("Redis holds %d units; %d admissions charged; %d scripts sent", held, charged, sent)
	}

	t.Logf("figure: SIGSTOP under load (%d workers, call deadline %v): breaker open %v after the stop", workers, callDeadline, toOpen.Round(time.Millisecond))
	t.Logf("figure: SIGSTOP: checks until the breaker opened: %v", st[0])
	t.Logf("figure: SIGSTOP: checks while open (probes time out): %v", st[1])
	t.Logf("figure: SIGCONT -> normal limiting in %v; checks meanwhile %v", recovery.Round(time.Millisecond), st[2])
	t.Logf("figure: SIGSTOP/SIGCONT: stopped %v; Redis holds %d units for %d admissions charged and %d scripts sent: %d timed-out scripts ran once after SIGCONT, none twice",
		stopped.Round(time.Millisecond), held, charged, sent, held-charged)

	// Restart (empty) under load.
	l2 := startLoad(t, r, loadReq, nil)
	warm(t, l2)
	if err := srv.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	back := l2.next(1)
	recovery = l2.untilNormal(t, recoverBound, "normal limiting after the restart", 1, back)
	st = l2.assertAnswered(t, 1)
	t.Logf("figure: restart (SIGKILL, start empty) under load -> normal limiting %v after Redis answers; checks meanwhile %v",
		recovery.Round(time.Millisecond), st[0])
	if recovery > recoverBound {
		t.Errorf("normal limiting %v after the restart, bound %v", recovery, recoverBound)
	}
	// Every counter starts full: the load's counters hold only what the
	// second load charged since.
	for w := range workers {
		req := loadReq(w, 0)
		if used := r.peekUsed(t, req); used > l2.charged[req.Key+" "+req.Path]+int64(l2.degraded[0].Load()+l2.degraded[1].Load()) {
			t.Errorf("%s holds %d units after the empty restart; %d charged since", req.Key, used, l2.charged[req.Key+" "+req.Path])
		}
	}
}
