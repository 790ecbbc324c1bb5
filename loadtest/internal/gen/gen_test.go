package gen_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/gen"
	"github.com/tollgate/tollgate/loadtest/internal/keyspace"
	"github.com/tollgate/tollgate/loadtest/internal/report"
	"github.com/tollgate/tollgate/loadtest/internal/target"
	"github.com/tollgate/tollgate/loadtest/internal/testtarget"
)

var keys = keyspace.Config{Keys: 20, Prefix: "k", Dist: keyspace.Uniform, Paths: []string{"/a"}}

// httpConfig returns a Config sending to url through the proxy target.
func httpConfig(t *testing.T, url string) gen.Config {
	t.Helper()
	tgt := target.NewProxy(target.HTTPConfig{URL: url, Method: http.MethodGet, Conns: 8})
	t.Cleanup(func() { _ = tgt.Close() })
	return gen.Config{
		Target: tgt, Recorder: report.NewRecorder(tgt.Outcomes()), Keys: keys, Seed: 1,
		Workers: 8, MaxInFlight: 64, Duration: time.Minute, Timeout: 5 * time.Second,
	}
}

func TestClosedLoopExactRequests(t *testing.T) {
	t.Parallel()
	srv := testtarget.StartHTTP(t, nil)
	cfg := httpConfig(t, srv.URL)
	cfg.Requests = 500
	res, err := gen.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	snap := cfg.Recorder.Snapshot()
	if srv.Requests() != 500 || res.Sent != 500 || snap.Answered() != 500 || snap.Counts[target.HTTP2xx] != 500 {
		t.Errorf("server saw %d, sent %d, answered %d (2xx %d); want 500 each",
			srv.Requests(), res.Sent, snap.Answered(), snap.Counts[target.HTTP2xx])
	}
	if res.StoppedBy != gen.StoppedByRequests {
		t.Errorf("stopped by %q, want requests", res.StoppedBy)
	}
	if snap.InFlight != 0 || snap.Errors != 0 {
		t.Errorf("in flight %d, errors %d after the run", snap.InFlight, snap.Errors)
	}
	// Keep-alive: the workers reuse their connections. (A few more than one
	// each: net/http returns a drained connection to the pool
	// asynchronously, so a worker's next request may dial.)
	if c := srv.Conns(); c > 2*int64(cfg.Workers) {
		t.Errorf("%d connections for %d workers and 500 requests", c, cfg.Workers)
	}
}

func TestOpenLoopRate(t *testing.T) {
	t.Parallel()
	srv := testtarget.StartHTTP(t, nil)
	cfg := httpConfig(t, srv.URL)
	cfg.Rate, cfg.Duration, cfg.MaxInFlight = 200, time.Second, 1024
	res, err := gen.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if n := srv.Requests(); n < 150 || n > 250 {
		t.Errorf("server saw %d requests in an open-loop second at 200/s, want ≈200 (result %+v)", n, res)
	}
	if res.Sent != srv.Requests() {
		t.Errorf("sent %d, server saw %d", res.Sent, srv.Requests())
	}
	if res.Elapsed < 900*time.Millisecond || res.Elapsed > 30*time.Second {
		t.Errorf("elapsed %v, want ≈1s", res.Elapsed)
	}
	if res.StoppedBy != gen.StoppedByDuration {
		t.Errorf("stopped by %q, want duration", res.StoppedBy)
	}
}

func TestOpenLoopRequestBound(t *testing.T) {
	t.Parallel()
	srv := testtarget.StartHTTP(t, nil)
	cfg := httpConfig(t, srv.URL)
	cfg.Rate, cfg.Requests = 1000, 50
	res, err := gen.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if srv.Requests() != 50 || res.StoppedBy != gen.StoppedByRequests {
		t.Errorf("server saw %d, stopped by %q; want 50, requests", srv.Requests(), res.StoppedBy)
	}
}

func TestClosedLoopDuration(t *testing.T) {
	t.Parallel()
	srv := testtarget.StartHTTP(t, nil)
	cfg := httpConfig(t, srv.URL)
	cfg.Duration = 300 * time.Millisecond
	res, err := gen.Run(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if res.StoppedBy != gen.StoppedByDuration || res.Elapsed < cfg.Duration || res.Elapsed > 5*time.Second {
		t.Errorf("stopped by %q after %v, want duration after ≈%v", res.StoppedBy, res.Elapsed, cfg.Duration)
	}
	if res.Sent == 0 || cfg.Recorder.Snapshot().Answered() != res.Sent {
		t.Errorf("sent %d, answered %d", res.Sent, cfg.Recorder.Snapshot().Answered())
	}
}

// TestInterrupt cancels the run while requests hang in the server: Run
// returns at once, the hung requests count as cancelled, not as errors.
func TestInterrupt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	srv := testtarget.StartHTTP(t, func(w http.ResponseWriter, r *http.Request, _ string, n int64) {
		if n < 50 {
			return
		}
		if n == 50 {
			cancel()
		}
		<-r.Context().Done() // hang until the client gives up
	})
	cfg := httpConfig(t, srv.URL)
	cfg.Requests = 1_000_000
	res, err := gen.Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	snap := cfg.Recorder.Snapshot()
	if res.StoppedBy != gen.StoppedByInterrupted {
		t.Errorf("stopped by %q, want interrupted", res.StoppedBy)
	}
	// Answers 1–49 may still be on their way when request 50 cancels.
	if snap.Answered() > 49 || snap.Cancelled == 0 || snap.Errors != 0 || snap.InFlight != 0 {
		t.Errorf("answered %d, cancelled %d, errors %d, in flight %d; want ≤ 49, > 0, 0, 0",
			snap.Answered(), snap.Cancelled, snap.Errors, snap.InFlight)
	}
	if res.Sent != snap.Answered()+snap.Cancelled {
		t.Errorf("sent %d ≠ answered %d + cancelled %d", res.Sent, snap.Answered(), snap.Cancelled)
	}
}

func TestTimeoutsAreErrors(t *testing.T) {
	t.Parallel()
	srv := testtarget.StartHTTP(t, func(w http.ResponseWriter, r *http.Request, _ string, _ int64) {
		<-r.Context().Done()
	})
	cfg := httpConfig(t, srv.URL)
	cfg.Requests, cfg.Workers, cfg.Timeout = 4, 2, 50*time.Millisecond
	if _, err := gen.Run(t.Context(), cfg); err != nil {
		t.Fatal(err)
	}
	snap := cfg.Recorder.Snapshot()
	if snap.Errors != 4 || snap.Answered() != 0 {
		t.Errorf("errors %d, answered %d; want 4, 0", snap.Errors, snap.Answered())
	}
	for msg := range cfg.Recorder.ErrorSamples() {
		if !strings.Contains(msg, "deadline exceeded") {
			t.Errorf("error sample %q does not name the timeout", msg)
		}
	}
}

// slowFirst answers at once, except the first request, which takes slow.
type slowFirst struct {
	slow  time.Duration
	calls atomic.Int64
}

func (s *slowFirst) Outcomes() []report.Outcome {
	return []report.Outcome{{Name: "ok", Decision: true}}
}

func (s *slowFirst) Do(ctx context.Context, _ gen.Request) (int, error) {
	if s.calls.Add(1) == 1 {
		select {
		case <-time.After(s.slow): // the simulated service time of a stalled server
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
	return 0, nil
}

// TestOpenLoopNoCoordinatedOmission stalls the first request while only
// one may be in flight: the requests due meanwhile wait for the slot, and
// their latency, measured from their scheduled time, shows the stall.
func TestOpenLoopNoCoordinatedOmission(t *testing.T) {
	t.Parallel()
	tgt := &slowFirst{slow: 300 * time.Millisecond}
	rec := report.NewRecorder(tgt.Outcomes())
	res, err := gen.Run(t.Context(), gen.Config{
		Target: tgt, Recorder: rec, Keys: keys, Rate: 100, MaxInFlight: 1,
		Requests: 20, Duration: time.Minute, Timeout: 5 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.Waited == 0 {
		t.Error("no request waited for the only slot")
	}
	l := rec.Latency()
	if l.Count != 20 {
		t.Fatalf("%d answers, want 20", l.Count)
	}
	// The second request was due at 10ms and sent after ≥300ms.
	if l.P90 < 200_000 {
		t.Errorf("p90 = %dµs: the stall was omitted from the latencies (want ≥ 200ms)", l.P90)
	}
}

func TestInvalidConfig(t *testing.T) {
	t.Parallel()
	_, err := gen.Run(t.Context(), gen.Config{Rate: -1, Requests: -1})
	if err == nil {
		t.Fatal("Run accepted an empty config")
	}
	for _, want := range []string{"no target", "no recorder", "rate", "requests", "duration", "timeout", "keys"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
	if errors.Is(err, context.Canceled) {
		t.Error("odd error")
	}
}
