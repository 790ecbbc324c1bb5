package loadtest

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/httpguard"
)

// fakeLadder stands in for a gateway and an aggregator: once the storm
// has started, the storm key climbs one level every perLevel times the
// run reads its level from the operator API — whatever the machine's
// load, the run sees each level for that many samples; levels 0 and 1
// answer 429 with rate-limit headers and cost one "Redis call", level 2
// 429 PENALTY, level 3 403 with Connection: close (the gateway's bodies,
// written by its own code). The polite key is
// always admitted. It records the storm's source addresses.
type fakeLadder struct {
	perLevel int64
	reads    atomic.Int64 // of the storm key's level, since the storm started
	started  atomic.Int64 // Unix ns of the storm's first request
	redis    atomic.Int64
	closed   atomic.Int64
	mu       sync.Mutex
	sources  map[string]int
	polite   map[string]int
	lifted   []string
}

func (f *fakeLadder) level() int {
	return int(min(f.reads.Load()/f.perLevel, TopLevel))
}

func (f *fakeLadder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	host, _, _ := net.SplitHostPort(r.RemoteAddr)
	switch {
	case r.URL.Path == "/metrics":
		level := f.level()
		fmt.Fprintf(w, "tollgate_redis_calls_total{gateway=\"x\"} %d\n", f.redis.Load())
		for l := 1; l <= TopLevel; l++ {
			n := 0
			if l == level {
				n = 1
			}
			fmt.Fprintf(w, "tollgate_penalized_keys{gateway=\"x\",level=\"%d\"} %d\n", l, n)
		}
		fmt.Fprintf(w, "tollgate_penalty_connections_closed_total{gateway=\"x\",reason=\"penalty\"} %d\n", f.closed.Load())
		fmt.Fprintf(w, "tollgate_accept_throttled_addresses{gateway=\"x\"} 0\n")
	case strings.HasPrefix(r.URL.Path, "/admin/v1/penalties/"):
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		key := strings.TrimPrefix(r.URL.Path, "/admin/v1/penalties/")
		if r.Method == http.MethodDelete {
			f.mu.Lock()
			f.lifted = append(f.lifted, key)
			f.mu.Unlock()
			fmt.Fprint(w, `{"level":0,"history":[]}`)
			return
		}
		level := 0
		if key == DefaultStormKey {
			level = f.level()
			if f.started.Load() != 0 {
				f.reads.Add(1)
			}
		}
		fmt.Fprintf(w, `{"level":%d,"history":[]}`, level)
	case r.Header.Get("X-API-Key") == DefaultPoliteKey:
		f.mu.Lock()
		f.polite[host]++
		f.mu.Unlock()
		f.redis.Add(1)
		fmt.Fprint(w, "ok")
	default:
		f.started.CompareAndSwap(0, time.Now().UnixNano())
		f.mu.Lock()
		f.sources[host]++
		f.mu.Unlock()
		switch level := f.level(); level {
		case 0, 1:
			f.redis.Add(1)
			w.Header().Set("X-RateLimit-Limit", "1000")
			w.Header().Set("Retry-After", "3")
			w.WriteHeader(http.StatusTooManyRequests)
		case 2: // the gateway's own answer
			httpguard.WriteDecision(w, r, &guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty,
				Deciding: -1, RetryAfter: 900, PenaltyLevel: 2, PenaltyReason: "ignored Retry-After"})
		default:
			f.closed.Add(1)
			w.Header().Set("Connection", "close")
			httpguard.WriteDecision(w, r, &guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted,
				Deciding: -1, PenaltyLevel: 3, PenaltyReason: "ignored Retry-After"})
		}
	}
}

// TestStormScenario runs a small storm against the fake: every client on
// its own address, the polite client apart and admitted, the levels and
// phases found, Redis calls per rejection 1 before the penalty and 0 after,
// the run stopped by itself once the top was held.
func TestStormScenario(t *testing.T) {
	t.Parallel()
	f := &fakeLadder{perLevel: 20, sources: map[string]int{}, polite: map[string]int{}}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)

	cfg := DefaultStormConfig()
	cfg.URL, cfg.Metrics, cfg.Admin, cfg.AdminToken = srv.URL, srv.URL+"/metrics", srv.URL, "tok"
	cfg.Clients, cfg.Hold, cfg.Settle, cfg.Interval = 5, 2*time.Second, 200*time.Millisecond, 50*time.Millisecond
	cfg.Duration = 30 * time.Second
	cfg.PID = os.Getpid()
	var progress bytes.Buffer
	s, err := RunStorm(context.Background(), cfg, &progress)
	if err != nil {
		t.Fatal(err)
	}
	var text bytes.Buffer
	if err := s.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + text.String())

	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.sources) != 5 {
		t.Errorf("storm sources %v, want 5 distinct addresses", f.sources)
	}
	for _, a := range []string{"127.0.0.2", "127.0.0.6"} {
		if f.sources[a] == 0 {
			t.Errorf("no storm request from %s: %v", a, f.sources)
		}
	}
	if len(f.polite) != 1 || f.polite[DefaultPoliteSource] == 0 {
		t.Errorf("polite sources %v, want only %s", f.polite, DefaultPoliteSource)
	}
	if s.StoppedBy != "top level held" {
		t.Errorf("stopped by %q", s.StoppedBy)
	}
	if len(s.Levels) != TopLevel {
		t.Fatalf("levels %+v", s.Levels)
	}
	for i, l := range s.Levels {
		if l.Aggregator < 0 || l.Gateway < 0 || (i > 0 && l.Aggregator < s.Levels[i-1].Aggregator) {
			t.Errorf("level times %+v", s.Levels)
		}
	}
	// The fake rejects from the first request; a first answer slower than
	// the first sampling interval still shows a phase "within the limit".
	phases := s.Phases
	if len(phases) > 0 && phases[0].Name == withinLimit {
		phases = phases[1:]
	}
	if len(phases) != TopLevel+2 {
		t.Fatalf("phases %+v, want one per level and the steady top", s.Phases)
	}
	if got := phases[0].RedisPerRejection; got < 0.95 || got > 1.05 { // counters and metrics are read a moment apart
		t.Errorf("before any penalty: %v Redis calls per rejection, want 1", got)
	}
	// The fake's Redis counter counts the polite client's calls too, as
	// Redis does: a residue below the verdict's threshold is theirs.
	if s.RedisPerRejectionPenalised >= 0.0005 {
		t.Errorf("%v Redis calls per rejection once penalised, want 0 (the polite client's aside)", s.RedisPerRejectionPenalised)
	}
	if phases[0].CPUPerSecond < 0 || s.Storm.Closed == 0 || s.Storm.Blocked == 0 || s.Storm.Penalty == 0 {
		t.Errorf("phases %+v, storm %+v", s.Phases, s.Storm)
	}
	// The report tells the ladder's answers from a rule's (its recorder
	// counts the last answers of a client the end interrupted, the storm's
	// counters not: one each at most).
	statuses := s.recorder.Counts()
	near := func(a, b int64) bool { return a >= b && a <= b+int64(cfg.Clients) }
	if !near(statuses["429 PENALTY"], s.Storm.Penalty) || !near(statuses["403 PENALTY"], s.Storm.Blocked) ||
		!near(statuses["429"], s.Storm.RateLimited) || statuses["403"] != 0 || s.Storm.Penalty == 0 {
		t.Errorf("report statuses %v, storm %+v", statuses, s.Storm)
	}
	if !s.Polite.Untouched() || s.Polite.Level != 0 {
		t.Errorf("polite %+v: want untouched", s.Polite)
	}
	if len(f.lifted) != 1 || f.lifted[0] != DefaultStormKey {
		t.Errorf("lifted %v, want the storm key at the end", f.lifted)
	}
	if !strings.Contains(progress.String(), "level 3 (gateway ") {
		t.Errorf("progress lines never showed the top level:\n%s", progress.String())
	}
	var page bytes.Buffer
	if err := s.WriteHTML(&page); err != nil || !strings.Contains(page.String(), "Gateway CPU") {
		t.Errorf("HTML page: %v", err)
	}
	// The page counts the ladder's answers; a storm provokes them on
	// purpose, so it gives no advice against them.
	if p := page.String(); !strings.Contains(p, "came from the penalty ladder") || strings.Contains(p, "TOLLGATE_PENALTY_MODE") {
		t.Error("the storm page's penalty line is missing or advises against the penalty")
	}
	// Every chart of the page shares the run's x axis; levels are whole.
	sum := s.htmlSummary()
	x := sum.ChartX()
	if len(sum.Charts) != 3 || len(x) < 3 {
		t.Fatalf("%d gateway charts over %d seconds", len(sum.Charts), len(x))
	}
	for _, c := range sum.Charts {
		if !slices.Equal(c.X, x) {
			t.Errorf("chart %q over %v, the run's charts over %v", c.Title, c.X, x)
		}
		if strings.Contains(c.Title, "level") && (c.YMax != TopLevel || c.YLabels != TopLevel+1) {
			t.Errorf("level chart's y axis: max %v, %d labels", c.YMax, c.YLabels)
		}
		// No gap over a second the sampler covered whole (a last, partial
		// second after its last sample is rightly unknown).
		sampled := s.samples[len(s.samples)-1].at.Seconds()
		for i, v := range c.Series[0].Values {
			if i > 0 && x[i] <= sampled && math.IsNaN(v) && !strings.Contains(c.Title, "Redis") {
				t.Errorf("chart %q has a gap before %.2fs: %v over %v", c.Title, sampled, c.Series[0].Values, x)
				break
			}
		}
	}
	// The aggregator's level is read at every sample (the gateway's only
	// every 2 s at the top).
	if agg := sum.Charts[1].Series[0].Values; agg[len(agg)-1] != TopLevel {
		t.Errorf("aggregator's level over the run %v, want %d at the end", agg, TopLevel)
	}
}

func TestStormConfigValidate(t *testing.T) {
	t.Parallel()
	ok := DefaultStormConfig()
	ok.AdminToken = "tok"
	if err := ok.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	for _, tc := range []struct {
		name string
		mut  func(*StormConfig)
		want string
	}{
		{"polite among the storm", func(c *StormConfig) { c.PoliteSource = "127.0.0.50" }, "among the storm"},
		{"source not loopback", func(c *StormConfig) { c.Source = "10.0.0.1" }, "loopback"},
		{"same keys", func(c *StormConfig) { c.PoliteKey = c.Key }, "differ"},
		{"unbounded", func(c *StormConfig) { c.Duration = time.Hour }, "duration"},
		{"lift without token", func(c *StormConfig) { c.AdminToken = "" }, "lifting"},
		{"settle beyond hold", func(c *StormConfig) { c.Settle = c.Hold }, "hold"},
	} {
		c := ok
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error about %q", tc.name, err, tc.want)
		}
	}
}

// TestStormRedisVerdict: Redis calls from level 2 on beyond one per
// polite request are met when the polite client's requests can account
// for them, or the lease units given back while the steady top has no
// more than its polite requests; the line says which.
func TestStormRedisVerdict(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		residue       float64
		polite        int64
		returned      float64
		topResidue    float64
		topPolite     int64
		want, wantNot string
	}{
		{"none", 0, 80, 0, 0, 40, "Redis calls per rejection once penalised, level 2 and up (target 0: met)", ""},
		{"the polite client's", 6, 80, 0, 0, 40, "(target 0: met: 6 calls beyond one per polite request, fewer than the polite client's 80 requests", ""},
		{"returns after the penalty", 120, 80, 1200, 3, 40, "(target 0: met: 120 calls beyond one per polite request while the gateway gave back 1200 lease units", ""},
		{"returns, top unknown", 12, 10, 1000, -1, 0, "(target 0: met: 12 calls beyond one per polite request while the gateway gave back 1000 lease units", ""},
		{"no returns", 120, 80, 0, 0, 40, "(target 0: NOT met: 120 calls", "(target 0: met"},
		{"calls at the top", 120, 80, 1200, 50, 40, "(target 0: NOT met: 120 calls", "(target 0: met"},
		{"more than the returns", 5000, 80, 1200, 3, 40, "(target 0: NOT met: 5000 calls", "(target 0: met"},
	} {
		s := &StormSummary{RedisPerRejectionPenalised: tt.residue / 10000, RedisResiduePenalised: tt.residue, PoliteRequestsPenalised: tt.polite,
			ReturnedPenalised: tt.returned, TopRedisResidue: tt.topResidue, TopPoliteRequests: tt.topPolite, Polite: PoliteResult{Level: -1, History: -1}}
		var b bytes.Buffer
		if err := s.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(b.String(), tt.want) || (tt.wantNot != "" && strings.Contains(b.String(), tt.wantNot)) {
			t.Errorf("%s:\n%s\nwant %q", tt.name, b.String(), tt.want)
		}
	}
}

// A sample whose level read failed keeps the level last read; only a time
// no read reaches is unknown.
func TestLevelAtKeepsTheLastRead(t *testing.T) {
	s := func(sec float64, agg, gw int) stormSample {
		return stormSample{at: time.Duration(sec * float64(time.Second)), level: agg, gwLevel: gw}
	}
	samples := []stormSample{s(0.5, -1, -1), s(1, 0, 0), s(2, -1, 1), s(3, -1, -1), s(4, 2, -1)}
	tests := []struct {
		t       float64
		gateway bool
		want    float64
	}{
		{0.7, false, math.NaN()},
		{1, false, 0},
		{2.5, false, 0},
		{3.5, false, 0},
		{4, false, 2},
		{0.7, true, math.NaN()},
		{2, true, 1},
		{3.9, true, 1},
	}
	for _, tt := range tests {
		got := levelAt(samples, tt.t, tt.gateway)
		if got != tt.want && !(math.IsNaN(got) && math.IsNaN(tt.want)) {
			t.Errorf("levelAt(%v, gateway %v) = %v, want %v", tt.t, tt.gateway, got, tt.want)
		}
	}
}
