package breaker

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakeClock is a manual clock, in nanoseconds.
type fakeClock struct{ now atomic.Int64 }

func (c *fakeClock) Now() int64              { return c.now.Load() }
func (c *fakeClock) Advance(d time.Duration) { c.now.Add(int64(d)) }

// step is one action of a scripted scenario.
type step struct {
	calls   int           // calls to make: Allow (must be true), then Record(ok)
	ok      bool          // their outcome
	advance time.Duration // time to let pass first
	allow   int           // > 0: Allow is called this many times...
	allowed int           // ...and this many must be true (none recorded)
	record  string        // "ok" or "fail": Record without Allow
	want    State         // state after the step
}

func calls(n int, ok bool, want State) step { return step{calls: n, ok: ok, want: want} }
func wait(d time.Duration, want State) step { return step{advance: d, want: want} }
func allows(n, allowed int, want State) step {
	return step{allow: n, allowed: allowed, want: want}
}
func record(outcome string, want State) step { return step{record: outcome, want: want} }

func TestBreaker(t *testing.T) {
	t.Parallel()
	base := Config{Window: time.Second, MinRequests: 20, FailureRatio: 0.5, ConsecutiveFailures: 5, OpenFor: 500 * time.Millisecond, Probes: 1}
	with := func(f func(*Config)) Config { c := base; f(&c); return c }
	noConsec := with(func(c *Config) { c.ConsecutiveFailures = -1 })
	for _, tc := range []struct {
		name  string
		cfg   Config
		steps []step
		// transitions expected through OnStateChange, "from>to" joined by ",".
		transitions string
	}{
		{
			name:  "quiet failures below min requests stay closed",
			cfg:   noConsec,
			steps: []step{calls(19, false, Closed)},
		},
		{
			name:        "error ratio over min requests opens",
			cfg:         noConsec,
			steps:       []step{calls(10, true, Closed), calls(9, false, Closed), calls(1, false, Open)},
			transitions: "closed>open",
		},
		{
			name:  "error ratio below threshold stays closed",
			cfg:   noConsec,
			steps: []step{calls(11, true, Closed), calls(4, false, Closed), calls(1, true, Closed), calls(4, false, Closed)},
		},
		{
			name:        "consecutive failures open a quiet breaker",
			cfg:         base,
			steps:       []step{calls(4, false, Closed), calls(1, false, Open), allows(3, 0, Open)},
			transitions: "closed>open",
		},
		{
			name:  "a success resets the consecutive count",
			cfg:   base,
			steps: []step{calls(4, false, Closed), calls(1, true, Closed), calls(4, false, Closed)},
		},
		{
			name: "failures leave the window",
			cfg:  noConsec,
			steps: []step{
				calls(10, false, Closed), wait(1100*time.Millisecond, Closed),
				calls(10, true, Closed), calls(9, false, Closed), // 9 of 19 in the window
				calls(1, true, Closed), // 9 of 20: below half
			},
		},
		{
			name: "open refuses, then half-opens with one probe",
			cfg:  base,
			steps: []step{
				calls(5, false, Open),
				wait(499*time.Millisecond, Open), allows(10, 0, Open),
				wait(time.Millisecond, Open), allows(10, 1, HalfOpen),
			},
			transitions: "closed>open,open>half_open",
		},
		{
			name: "probe success closes with an empty window",
			cfg:  base,
			steps: []step{
				calls(5, false, Open), wait(500*time.Millisecond, Open),
				allows(1, 1, HalfOpen), record("ok", Closed),
				calls(4, false, Closed), calls(1, false, Open),
			},
			transitions: "closed>open,open>half_open,half_open>closed,closed>open",
		},
		{
			name: "probe failure reopens for another period",
			cfg:  base,
			steps: []step{
				calls(5, false, Open), wait(500*time.Millisecond, Open),
				allows(1, 1, HalfOpen), record("fail", Open),
				wait(499*time.Millisecond, Open), allows(5, 0, Open),
				wait(time.Millisecond, Open), allows(5, 1, HalfOpen),
			},
			transitions: "closed>open,open>half_open,half_open>open,open>half_open",
		},
		{
			name: "several probes at once",
			cfg:  with(func(c *Config) { c.Probes = 3 }),
			steps: []step{
				calls(5, false, Open), wait(600*time.Millisecond, Open),
				allows(10, 3, HalfOpen), record("ok", Closed),
			},
			transitions: "closed>open,open>half_open,half_open>closed",
		},
		{
			name: "an unanswered probe does not wedge the breaker",
			cfg:  base,
			steps: []step{
				calls(5, false, Open), wait(500*time.Millisecond, Open),
				allows(1, 1, HalfOpen), wait(499*time.Millisecond, HalfOpen), allows(5, 0, HalfOpen),
				wait(time.Millisecond, HalfOpen), allows(5, 1, HalfOpen),
				record("ok", Closed),
			},
			transitions: "closed>open,open>half_open,half_open>closed",
		},
		{
			name:  "late outcomes while open are ignored",
			cfg:   base,
			steps: []step{calls(5, false, Open), record("ok", Open), record("fail", Open)},
			// no extra transition
			transitions: "closed>open",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var clk fakeClock
			clk.now.Store(int64(time.Hour)) // any origin
			var seen []string
			cfg := tc.cfg
			cfg.Clock = clk.Now
			cfg.OnStateChange = func(from, to State) { seen = append(seen, from.String()+">"+to.String()) }
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, s := range tc.steps {
				clk.Advance(s.advance)
				for j := range s.calls {
					if !b.Allow() {
						t.Fatalf("step %d: call %d refused in state %v", i, j, b.State())
					}
					b.Record(s.ok)
				}
				if s.allow > 0 {
					// Refusing says what the first Allow will do when the
					// breaker is open, and changes nothing.
					before := b.State()
					refusing := b.Refusing()
					if b.State() != before {
						t.Fatalf("step %d: Refusing moved the breaker from %v to %v", i, before, b.State())
					}
					n := 0
					for range s.allow {
						if b.Allow() {
							n++
						}
					}
					if n != s.allowed {
						t.Fatalf("step %d: %d of %d allowed, want %d", i, n, s.allow, s.allowed)
					}
					if refusing != (n == 0) {
						t.Fatalf("step %d: Refusing %v in state %v, yet %d of %d allowed", i, refusing, before, n, s.allow)
					}
				}
				if s.record != "" {
					b.Record(s.record == "ok")
				}
				if got := b.State(); got != s.want {
					total, fails := b.Stats()
					t.Fatalf("step %d: state %v, want %v (window %d calls, %d failures)", i, got, s.want, total, fails)
				}
			}
			if got := strings.Join(seen, ","); got != tc.transitions {
				t.Fatalf("transitions %q, want %q", got, tc.transitions)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		cfg  Config
		errs []string
	}{
		{"zero means defaults", Config{}, nil},
		{"every fault at once", Config{Window: 5, MinRequests: -1, FailureRatio: 1.5, ConsecutiveFailures: -2, OpenFor: -1, Probes: -1},
			[]string{"window", "min requests", "failure ratio", "consecutive failures", "open for", "probes"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b, err := New(tc.cfg)
			if len(tc.errs) == 0 {
				if err != nil {
					t.Fatal(err)
				}
				c := b.Config()
				if c.Window != DefaultWindow || c.MinRequests != DefaultMinRequests || c.FailureRatio != DefaultFailureRatio ||
					c.ConsecutiveFailures != DefaultConsecutiveFailures || c.OpenFor != DefaultOpenFor || c.Probes != DefaultProbes {
					t.Fatalf("defaults not applied: %+v", c)
				}
				return
			}
			if err == nil {
				t.Fatal("no error")
			}
			for _, want := range tc.errs {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
		})
	}
}

// TestConcurrent hammers one breaker from many goroutines through every
// state (run with -race): it must end closed once the backend is healthy.
func TestConcurrent(t *testing.T) {
	t.Parallel()
	var clk fakeClock
	var changes atomic.Int64
	b, err := New(Config{Clock: clk.Now, OnStateChange: func(State, State) { changes.Add(1) }})
	if err != nil {
		t.Fatal(err)
	}
	var healthy atomic.Bool
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 20_000 {
				if g == 0 && i%100 == 0 {
					clk.Advance(10 * time.Millisecond)
				}
				if b.Allow() {
					b.Record(healthy.Load() || i%3 == 0)
				}
			}
		}()
	}
	wg.Wait()
	if changes.Load() == 0 || b.State() == Closed {
		t.Fatalf("failing backend: state %v after %d changes", b.State(), changes.Load())
	}
	healthy.Store(true)
	for i := 0; b.State() != Closed; i++ {
		if i > 1000 {
			t.Fatalf("breaker did not close: %v", b.State())
		}
		clk.Advance(100 * time.Millisecond)
		if b.Allow() {
			b.Record(true)
		}
	}
}

func TestAllocations(t *testing.T) {
	var clk fakeClock
	b, _ := New(Config{Clock: clk.Now, ConsecutiveFailures: -1})
	i := 0
	n := testing.AllocsPerRun(1000, func() {
		i++
		clk.Advance(time.Millisecond)
		if b.Allow() {
			b.Record(i%4 != 0)
		}
	})
	if n != 0 {
		t.Fatalf("%v allocations per Allow+Record", n)
	}
	if b.State() != Closed {
		t.Fatalf("25%% failures opened the breaker")
	}
}

func BenchmarkAllowRecord(b *testing.B) {
	br, _ := New(Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if br.Allow() {
				br.Record(true)
			}
		}
	})
}

func ExampleBreaker() {
	var now int64 // a test clock, in nanoseconds
	b, _ := New(Config{Clock: func() int64 { return now }, OnStateChange: func(from, to State) {
		fmt.Println(from, "->", to)
	}})
	for range 5 { // five timeouts in a row
		if b.Allow() {
			b.Record(false)
		}
	}
	fmt.Println("allowed while open:", b.Allow())
	now += int64(DefaultOpenFor)
	fmt.Println("probe allowed:", b.Allow())
	b.Record(true)
	// Output:
	// closed -> open
	// allowed while open: false
	// open -> half_open
	// probe allowed: true
	// half_open -> closed
}

// TestNegativeClock: a clock of any origin works, negative times included.
func TestNegativeClock(t *testing.T) {
	t.Parallel()
	now := -int64(200 * time.Millisecond) // crosses zero
	b, err := New(Config{Clock: func() int64 { return now }, ConsecutiveFailures: -1})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 40 {
		now += int64(10 * time.Millisecond)
		if b.Allow() {
			b.Record(i%2 == 0)
		}
	}
	if b.State() != Open {
		t.Fatalf("half of 40 calls failed: %v", b.State())
	}
}
