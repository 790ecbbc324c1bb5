// Package history is the record of a chaos soak: what every client saw
// (each request's answer and its times), every fault with the times it
// started and healed, every operator change, process starts and exits,
// and the usage reports and counts read at the end. The harness
// (package chaos) writes it; the checker (package checker) reads nothing
// else, so the two meet only here.
//
// Times are microseconds since the Unix epoch on the machine's clock:
// on loopback the same clock Redis's TIME reads.
//
// [Write] and [Read] store a history as JSON lines, one record a line
// (`loadtest chaos -history FILE`, `loadtest chaos -check FILE`).
package history

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Micros is a time in microseconds since the Unix epoch, or a duration in
// microseconds.
type Micros = int64

// Algorithms, as rules name them.
const (
	TokenBucket          = "token_bucket"
	FixedWindow          = "fixed_window"
	SlidingWindowLog     = "sliding_window_log"
	SlidingWindowCounter = "sliding_window_counter"
	GCRA                 = "gcra"
)

// Surfaces a request goes through.
const (
	SurfaceProxy = "proxy"
	SurfaceCheck = "check"
	SurfaceRLS   = "rls"
)

// Meta describes the run and the bounds the checker applies; each bound
// is documented in docs/reliability.md.
type Meta struct {
	Seed        uint64   `json:"seed"`
	RedisMode   string   `json:"redis_mode"`
	Gateways    int      `json:"gateways"`
	Aggregators int      `json:"aggregators"`
	Rate        float64  `json:"rate"`
	Kinds       []string `json:"kinds"`
	// Start and End bound the run; FaultStart and FaultEnd the fault
	// phase.
	Start      Micros `json:"start"`
	FaultStart Micros `json:"fault_start"`
	FaultEnd   Micros `json:"fault_end"`
	End        Micros `json:"end"`
	// FailureShare is the gateways' failure_share.
	FailureShare float64 `json:"failure_share"`
	// ClientDeadline is the client's deadline for an answer.
	ClientDeadline Micros `json:"client_deadline"`
	// FailOpenTail is how long after a Redis fault heals degraded
	// decisions are still expected (failover, breaker probe).
	FailOpenTail Micros `json:"fail_open_tail"`
	// SplitBound is how long a primary may go on admitting after it was
	// replaced (a split during a failover).
	SplitBound Micros `json:"split_bound"`
	// Propagation is the bound on an operator change reaching every
	// gateway.
	Propagation Micros `json:"propagation"`
	// RecoveryBound is the bound on a process being ready again after
	// its restart or resume.
	RecoveryBound Micros `json:"recovery_bound"`
	// LeaseShare is the part of a bucket's full-refill time a fast-path
	// lease may live, and MaxLeaseTTL the longest any lease lives.
	LeaseShare  float64 `json:"lease_share"`
	MaxLeaseTTL Micros  `json:"max_lease_ttl"`
	// MissingSlack is what the missing count may exceed the loss by.
	MissingSlack int64 `json:"missing_slack"`
	// MaxUnscheduledDegraded is the largest share of answers that may be
	// degraded outside the schedule's fail-open windows and the machine's
	// stalls (Redis past its deadline with nothing to explain it).
	MaxUnscheduledDegraded float64 `json:"max_unscheduled_degraded"`
	// StallTail is how long after a stall of the machine degraded answers
	// are still explained by it (the breaker's open time and its probe).
	StallTail Micros `json:"stall_tail"`
	// HealthzBound is how soon after its start a gateway or aggregator
	// answers /healthz, whatever its dependencies do.
	HealthzBound Micros `json:"healthz_bound"`
	// Interrupted is set when the run was cut short (its checks are then
	// incomplete).
	Interrupted bool `json:"interrupted,omitempty"`
}

// Rule is one rule of the soak's ruleset, as the checker models it.
type Rule struct {
	ID        string `json:"id"`
	Algorithm string `json:"algorithm"`
	// Limit is the limit, capacity or burst.
	Limit int64 `json:"limit"`
	// Window is the window of windowed algorithms and GCRA (µs).
	Window Micros `json:"window,omitempty"`
	// Rate is the refill in units per second of token buckets and GCRA.
	Rate      float64 `json:"rate,omitempty"`
	Precision int     `json:"precision,omitempty"`
	Strict    bool    `json:"strict"`
	// OnFailure is "open" or "closed".
	OnFailure string `json:"on_failure"`
	// Scope is "key" or "tenant".
	Scope string `json:"scope"`
	// Endpoints are the endpoints it matches (exactly).
	Endpoints []string `json:"endpoints"`
}

// Key is one API key of the load.
type Key struct {
	Name   string `json:"name"`
	Raw    string `json:"raw"`
	Tenant string `json:"tenant"`
	// Polite keys stay under their limits and wait out Retry-After.
	Polite bool `json:"polite,omitempty"`
}

// Answer is one request and what its client saw.
type Answer struct {
	Gateway  int    `json:"gw"`
	Surface  string `json:"surface"`
	Key      string `json:"key"`
	Endpoint string `json:"endpoint"`
	Cost     int64  `json:"cost"`
	// Sent is when the request left; Recv when its answer (or error)
	// came back.
	Sent Micros `json:"sent"`
	Recv Micros `json:"recv"`
	// Status is the HTTP status (RLS: 200 for OK, 429 for OVER_LIMIT);
	// 0 without an answer.
	Status     int    `json:"status,omitempty"`
	Degraded   bool   `json:"degraded,omitempty"`
	Code       string `json:"code,omitempty"`
	Rule       string `json:"rule,omitempty"`
	RetryAfter int64  `json:"retry_after,omitempty"`
	Limit      int64  `json:"limit,omitempty"`
	// Written: the request was written to its connection (an unanswered
	// request that was written may have been decided).
	Written bool   `json:"written,omitempty"`
	Err     string `json:"err,omitempty"`
}

// Decided reports whether the answer is a decision the gateway records:
// 200, 429 or 403.
func (a *Answer) Decided() bool { return a.Status == 200 || a.Status == 429 || a.Status == 403 }

// Allowed reports whether the answer admitted the request.
func (a *Answer) Allowed() bool { return a.Status == 200 }

// Indeterminate reports whether the request may or may not have been
// decided: written and never answered, or answered with an error the
// gateway gives after deciding (5xx from the proxy's upstream).
func (a *Answer) Indeterminate() bool {
	return (a.Status == 0 && a.Written) || a.Status >= 500
}

// Link names a link between two processes: Client is a process
// ("gw1", "agg2", "redis-a", "sentinel-1"), Server a group of processes
// ("redis", "kafka", "nats").
type Link struct {
	Client string `json:"client"`
	Server string `json:"server"`
}

// Fault is one fault of the schedule, as it happened.
type Fault struct {
	ID   int    `json:"id"`
	Kind string `json:"kind"`
	// Target is the process (or the client of the link).
	Target string `json:"target"`
	Link   *Link  `json:"link,omitempty"`
	// Detail says more (the latency added, the direction kept).
	Detail string `json:"detail,omitempty"`
	// At and For are the planned offset from the fault phase's start and
	// length.
	At  Micros `json:"at"`
	For Micros `json:"for"`
	// Start and End are when it was applied and healed (a kill: when the
	// process was restarted); End is 0 if it never healed.
	Start Micros `json:"start"`
	End   Micros `json:"end"`
	Error string `json:"error,omitempty"`
}

// Op kinds.
const (
	OpRules     = "rules"     // the ops rule's limit set to Limit
	OpBlock     = "blocklist" // Key blocklisted
	OpUnblock   = "unblock"   // Key's entry removed
	OpOverride  = "override"  // Key's key-scope limits × Factor
	OpUnrideKey = "unoverride"
	OpReset     = "reset" // Key's counters of Endpoint reset
	OpQuota     = "quota" // Tokens units given back to Key's counters of Endpoint
)

// Op is one operator change.
type Op struct {
	Kind     string  `json:"kind"`
	Key      string  `json:"key,omitempty"`
	Endpoint string  `json:"endpoint,omitempty"`
	Rule     string  `json:"rule,omitempty"`
	Limit    int64   `json:"limit,omitempty"`
	Factor   float64 `json:"factor,omitempty"`
	Tokens   int64   `json:"tokens,omitempty"`
	// TTL is the expiry of a blocklist entry or override (µs).
	TTL Micros `json:"ttl,omitempty"`
	// At is when it was sent, Done when its answer came back; Status is
	// that answer (0: none).
	At     Micros `json:"at"`
	Done   Micros `json:"done"`
	Status int    `json:"status"`
	Final  bool   `json:"final,omitempty"`
	Err    string `json:"err,omitempty"`
}

// Succeeded reports whether the operator API accepted the change.
func (o *Op) Succeeded() bool { return o.Status >= 200 && o.Status < 300 }

// Process event kinds.
const (
	ProcStart = "start"
	ProcReady = "ready"
	ProcExit  = "exit"
)

// Proc is a process event.
type Proc struct {
	Name string `json:"name"`
	Kind string `json:"kind"`
	At   Micros `json:"at"`
	// Planned: the exit was the harness's doing (a kill, a restart, the
	// end of the run).
	Planned bool   `json:"planned,omitempty"`
	Detail  string `json:"detail,omitempty"`
}

// Totals are a usage report's totals.
type Totals struct {
	Allowed  int64 `json:"allowed"`
	Rejected int64 `json:"rejected"`
	Cost     int64 `json:"cost"`
}

// Usage is one aggregator's usage report of every tenant, read at the
// end.
type Usage struct {
	Aggregator string            `json:"aggregator"`
	At         Micros            `json:"at"`
	Tenants    map[string]Totals `json:"tenants"`
	Err        string            `json:"err,omitempty"`
}

// Counts are the loss counters read at the end.
type Counts struct {
	// Missing is tollgate_aggregator_events_missing_total summed over the
	// aggregators and their lives.
	Missing int64 `json:"missing"`
	// Dropped is tollgate_events_dropped_total summed over the gateways
	// and their lives, as far as read before each exit.
	Dropped int64 `json:"dropped"`
	// Complete is false when an aggregator's count could not be read
	// before it died.
	Complete bool `json:"complete"`
}

// Stall is a time the machine kept the harness from running for longer
// than it should (a tick of its stall detector came late): every process
// on the machine was likely starved too, Redis and the gateways included.
type Stall struct {
	Start Micros `json:"start"`
	End   Micros `json:"end"`
}

// Probe is a timed liveness check.
type Probe struct {
	// What: "recovery" (a process ready again after a fault; Fault set),
	// "healthz" (a restarted process answering /healthz; Fault set),
	// "propagation" (the last operator change seen by a gateway),
	// "polite-penalty" (a polite key's penalty level at the end).
	What    string `json:"what"`
	Fault   int    `json:"fault,omitempty"`
	Kind    string `json:"kind,omitempty"`
	Target  string `json:"target,omitempty"`
	Took    Micros `json:"took"`
	OK      bool   `json:"ok"`
	Detail  string `json:"detail,omitempty"`
	Measure string `json:"measure,omitempty"`
}

// History is a whole run.
type History struct {
	Meta    Meta
	Rules   []Rule
	Keys    []Key
	Answers []Answer
	Faults  []Fault
	Ops     []Op
	Procs   []Proc
	Usage   []Usage
	Counts  Counts
	Probes  []Probe
	Stalls  []Stall
}

// line is one record of the JSON-lines form; exactly one field is set.
type line struct {
	Meta   *Meta   `json:"meta,omitempty"`
	Rule   *Rule   `json:"rule,omitempty"`
	Key    *Key    `json:"key,omitempty"`
	Answer *Answer `json:"a,omitempty"`
	Fault  *Fault  `json:"fault,omitempty"`
	Op     *Op     `json:"op,omitempty"`
	Proc   *Proc   `json:"proc,omitempty"`
	Usage  *Usage  `json:"usage,omitempty"`
	Counts *Counts `json:"counts,omitempty"`
	Probe  *Probe  `json:"probe,omitempty"`
	Stall  *Stall  `json:"stall,omitempty"`
}

// Write writes h as JSON lines.
func Write(w io.Writer, h *History) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	enc := json.NewEncoder(bw)
	put := func(l line) error {
		if err := enc.Encode(l); err != nil {
			return fmt.Errorf("history: write: %w", err)
		}
		return nil
	}
	errs := []error{put(line{Meta: &h.Meta}), put(line{Counts: &h.Counts}),
		putEach(h.Rules, put, func(r *Rule) line { return line{Rule: r} }),
		putEach(h.Keys, put, func(k *Key) line { return line{Key: k} }),
		putEach(h.Faults, put, func(f *Fault) line { return line{Fault: f} }),
		putEach(h.Ops, put, func(o *Op) line { return line{Op: o} }),
		putEach(h.Procs, put, func(p *Proc) line { return line{Proc: p} }),
		putEach(h.Usage, put, func(u *Usage) line { return line{Usage: u} }),
		putEach(h.Probes, put, func(p *Probe) line { return line{Probe: p} }),
		putEach(h.Stalls, put, func(s *Stall) line { return line{Stall: s} }),
	}
	for i := range h.Answers {
		if err := put(line{Answer: &h.Answers[i]}); err != nil {
			return err
		}
	}
	if err := errors.Join(errs...); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("history: write: %w", err)
	}
	return nil
}

// putEach puts a line of each of xs, made by wrap; the errors joined.
func putEach[T any](xs []T, put func(line) error, wrap func(*T) line) error {
	var errs []error
	for i := range xs {
		errs = append(errs, put(wrap(&xs[i])))
	}
	return errors.Join(errs...)
}

// Read reads a history written by Write. A line that is not a record is
// an error naming its number.
func Read(r io.Reader) (*History, error) {
	h := &History{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<16), 1<<24)
	n := 0
	for sc.Scan() {
		n++
		if len(sc.Bytes()) == 0 {
			continue
		}
		var l line
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("history: line %d: %w", n, err)
		}
		switch {
		case l.Meta != nil:
			h.Meta = *l.Meta
		case l.Counts != nil:
			h.Counts = *l.Counts
		case l.Rule != nil:
			h.Rules = append(h.Rules, *l.Rule)
		case l.Key != nil:
			h.Keys = append(h.Keys, *l.Key)
		case l.Answer != nil:
			h.Answers = append(h.Answers, *l.Answer)
		case l.Fault != nil:
			h.Faults = append(h.Faults, *l.Fault)
		case l.Op != nil:
			h.Ops = append(h.Ops, *l.Op)
		case l.Proc != nil:
			h.Procs = append(h.Procs, *l.Proc)
		case l.Usage != nil:
			h.Usage = append(h.Usage, *l.Usage)
		case l.Probe != nil:
			h.Probes = append(h.Probes, *l.Probe)
		case l.Stall != nil:
			h.Stalls = append(h.Stalls, *l.Stall)
		default:
			return nil, fmt.Errorf("history: line %d: not a record", n)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("history: read: %w", err)
	}
	return h, nil
}
