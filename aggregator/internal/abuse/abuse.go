// Package abuse is the aggregator's abuse detection and penalty ladder
// without Kafka or disk: decisions in, per-key detector state,
// ladder levels and the steps a key takes out.
//
// Detectors, per key, over a sliding window of event time (the decisions'
// time_unix_micros, Redis time):
//
//   - backoff_ignored: requests that arrive while a Retry-After sent to the
//     key is still running — after a rejection at t with Retry-After r, a
//     request of the key with a time in (t, t+r) — at least
//     BackoffMinIgnored of them and at least BackoffMinShare of the
//     window's requests;
//   - sustained_rejection: at least RejectionMinRequests requests and a
//     share of rejections (429 and 403) of at least RejectionRatio;
//   - volume_ceiling: more than VolumeCeiling requests per second over the
//     window.
//
// When a detector fires, its evidence is consumed (the window's counts
// start again) and the key climbs the ladder (tollgatev1.LadderRung says
// what each level enforces), each level enforced for its Config duration:
// ReducedFor (with Factor), CooldownFor, BlockFor. Only decisions made at
// the key's current level count towards the next: a step ignores the key's
// decisions up to Grace after its newest one (the time gateways need to
// learn of the step). A firing at level 3 while the block runs only
// postpones the step down; once the block has run out it blocks again. The
// wall clock (injected: every method takes now) drives enforcement expiry
// and the step down: a key no detector has fired on for QuietPeriod steps
// down one level, enforcing the lower level's action for at most what
// remained of the higher one's (a step down never makes anything longer or
// harsher). A lift (an operator's command, or an allowlisted decision of a
// penalised key) resets the level and the evidence, and decisions made
// before it never count again.
//
// A Table holds the state of one decisions partition: every key seen
// within Idle, penalised, or that took a step within Remember. Changes are made in a Txn, invisible to the
// Table until Commit, which is what the aggregator's Kafka transaction
// needs (package windows does the same for usage rows). Nothing here starts
// goroutines or is safe for concurrent use: one partition's table is owned
// by one processing loop.
package abuse

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Ladder levels: tollgatev1.LadderRung says what each enforces.
const (
	LevelNone     = tollgatev1.LevelNone
	LevelReduced  = tollgatev1.LevelReduced // its factor is Config.Factor
	LevelCooldown = tollgatev1.LevelCooldown
	LevelBlock    = tollgatev1.LevelBlock
	MaxLevel      = tollgatev1.MaxLevel
)

// Step actions (PenaltyEvent.action) besides a climb's, which is its
// level's (LevelAction).
const (
	ActionStepDown = "step_down"
	ActionLifted   = "lifted"
)

// Detector names (Evidence.detector).
const (
	DetectorBackoffIgnored     = "backoff_ignored"
	DetectorSustainedRejection = "sustained_rejection"
	DetectorVolumeCeiling      = "volume_ceiling"
)

// Detectors lists every detector, in the order they are evaluated.
var Detectors = []string{DetectorBackoffIgnored, DetectorSustainedRejection, DetectorVolumeCeiling}

// ReasonAllowlisted is the guard's reason of an allowlisted decision:
// never evidence, and it lifts a penalised key.
const ReasonAllowlisted = "allowlisted"

// Buckets is the number of sub-windows the window is counted in: evidence
// covers the newest Buckets sub-windows of Window/Buckets each.
const Buckets = 6

// Config holds the detectors' thresholds and the ladder's parameters.
// Zero fields take the defaults SetDefaults names.
type Config struct {
	// Off stops detection: no decision counts and no key climbs. Step
	// downs and lifts still apply, so penalties in force drain.
	Off bool
	// Detectors enabled (default: all of Detectors).
	Detectors []string
	// Window is the evidence window (default 1m, at least 1s).
	Window time.Duration
	// BackoffMinIgnored and BackoffMinShare: backoff_ignored fires with at
	// least this many ignored Retry-Afters (default 20) making at least
	// this share of the window's requests (default 0.5).
	BackoffMinIgnored int64
	BackoffMinShare   float64
	// RejectionMinRequests and RejectionRatio: sustained_rejection fires
	// with at least this many requests (default 100) of which at least
	// this share was rejected (default 0.9).
	RejectionMinRequests int64
	RejectionRatio       float64
	// VolumeCeiling: volume_ceiling fires above this many requests per
	// second over the window (default 10 000).
	VolumeCeiling float64
	// Factor scales a level-1 key's limits (default 0.5).
	Factor float64
	// ReducedFor, CooldownFor and BlockFor: how long levels 1, 2 and 3 are
	// enforced (defaults 5m, 15m, 24h).
	ReducedFor, CooldownFor, BlockFor time.Duration
	// QuietPeriod: a key no detector fired on for this long steps down one
	// level (default 1h).
	QuietPeriod time.Duration
	// Grace: after a step, the key's decisions up to this long after its
	// newest one do not count (default 2s: the bound within which a change reaches every gateway).
	Grace time.Duration
	// Idle: the state of a key at level 0 unseen for this long is dropped
	// (default 2 × Window)...
	Idle time.Duration
	// Remember: ...unless the key ever took a step: then it is kept until
	// this long after its last step (default 7 days), so its step counter
	// never starts again while an event of an earlier step could still be
	// applied somewhere.
	Remember time.Duration
}

// SetDefaults fills zero fields.
func (c *Config) SetDefaults() {
	if c.Detectors == nil {
		c.Detectors = slices.Clone(Detectors)
	}
	def := func(p *time.Duration, d time.Duration) {
		if *p <= 0 {
			*p = d
		}
	}
	def(&c.Window, time.Minute)
	def(&c.ReducedFor, 5*time.Minute)
	def(&c.CooldownFor, 15*time.Minute)
	def(&c.BlockFor, 24*time.Hour)
	def(&c.QuietPeriod, time.Hour)
	def(&c.Grace, 2*time.Second)
	def(&c.Idle, 2*c.Window)
	def(&c.Remember, 7*24*time.Hour)
	if c.BackoffMinIgnored <= 0 {
		c.BackoffMinIgnored = 20
	}
	if c.BackoffMinShare <= 0 {
		c.BackoffMinShare = 0.5
	}
	if c.RejectionMinRequests <= 0 {
		c.RejectionMinRequests = 100
	}
	if c.RejectionRatio <= 0 {
		c.RejectionRatio = 0.9
	}
	if c.VolumeCeiling <= 0 {
		c.VolumeCeiling = 10_000
	}
	if c.Factor <= 0 {
		c.Factor = 0.5
	}
}

// FieldError is a problem of one Config field, named as in the
// aggregator's penalty section.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Msg }

// Validate reports what SetDefaults cannot fix, as *FieldError.
func (c *Config) Validate() []error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, &FieldError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	for _, d := range c.Detectors {
		if !slices.Contains(Detectors, d) {
			bad("detectors", "%q is not one of %s", d, strings.Join(Detectors, ", "))
		}
	}
	if c.Window > 0 && c.Window < time.Second {
		bad("window", "%v is shorter than 1s", c.Window)
	}
	if c.BackoffMinShare > 1 {
		bad("backoff_min_share", "%v is a share: at most 1", c.BackoffMinShare)
	}
	if c.RejectionRatio > 1 {
		bad("rejection_ratio", "%v is a share: at most 1", c.RejectionRatio)
	}
	if c.Factor >= 1 {
		bad("factor", "%v does not reduce limits: want a number in (0, 1)", c.Factor)
	}
	return errs
}

// Duration is how long level l is enforced.
func (c *Config) Duration(l int) time.Duration {
	switch l {
	case LevelReduced:
		return c.ReducedFor
	case LevelCooldown:
		return c.CooldownFor
	case LevelBlock:
		return c.BlockFor
	}
	return 0
}

// LevelAction is the name of what level l enforces: reduced_limit,
// cooldown, blocklist, or "none" for level 0.
func LevelAction(l int) string { return tollgatev1.LadderRung(l).Action }

func (c *Config) enabled(detector string) bool { return slices.Contains(c.Detectors, detector) }

// width is the length of one sub-window in microseconds.
func (c *Config) width() int64 { return max(1, c.Window.Microseconds()/Buckets) }

// Decision is what the detectors read of one decision event (a
// KIND_DECISION event the usage windows counted: never a duplicate).
type Decision struct {
	KeyID      string
	KeyPrefix  string
	Tenant     string
	TimeMicros int64 // event time
	Allowed    bool
	RetryAfter int64  // seconds; 0 when none was sent
	Reason     string // the guard's reason
}

// Lift is an operator's command to lift a key's penalty.
type Lift struct {
	KeyID  string
	Tenant string
	// TimeMicros is when it was asked for: the key's decisions before it
	// never count again. A lift at or before the key's last lift changes
	// nothing (a lift applies once).
	TimeMicros int64
	Actor      string
	Reason     string
}

// Bucket counts one sub-window of a key's decisions.
type Bucket struct {
	Start    int64 // event time, µs, a multiple of the sub-window
	Requests int64
	Rejected int64
	Ignored  int64 // arrived while a Retry-After sent to the key ran
	First    int64 // event times of the first and last decision counted
	Last     int64
}

// State is one key's detector and ladder state. It holds no pointers, so
// a copy is a snapshot.
type State struct {
	Tenant    string
	KeyPrefix string
	Level     int
	// Step counts the key's steps (up, down, lifted); never reset.
	Step uint64
	// Since is when the level was entered; Until when its enforcement
	// ends (wall clock, µs; Until ≤ now: nothing is enforced).
	Since, Until int64
	// LastFiring is when a detector last fired (wall clock, µs); VolumeAt
	// when volume_ceiling did.
	LastFiring int64
	VolumeAt   int64
	// Floor: the key's decisions with an event time before it never count
	// (a step's grace, a lift).
	Floor int64
	// LiftedAt is the time of the last lift applied (its command's time).
	LiftedAt int64
	// RetryFrom and RetryUntil bound the Retry-After the key was last told
	// to honour (event time, µs): a request in (RetryFrom, RetryUntil)
	// ignored it.
	RetryFrom, RetryUntil int64
	// Touched is when a decision of the key was last observed (wall clock,
	// µs), for eviction.
	Touched int64
	Ring    [Buckets]Bucket
}

// Enforced reports whether the key's level is enforced at now (µs).
func (s *State) Enforced(now int64) bool { return s.Level > 0 && s.Until > now }

// Evidence is what one detector saw.
type Evidence struct {
	Detector      string
	WindowSeconds int64
	Requests      int64
	Rejected      int64
	Ignored       int64
	Ratio         float64
	RatePerSecond float64
	First, Last   int64 // event times, µs
}

// Step is one move of a key on the ladder: what the processor publishes
// (PenaltyEvent, AuditEntry) and the KV reconciler applies.
type Step struct {
	KeyID     string
	KeyPrefix string
	Tenant    string
	Step      uint64
	Level     int
	Previous  int
	Action    string
	// Factor is Config.Factor at level 1, else 0.
	Factor float64
	// StartsAt and ExpiresAt are wall-clock µs; ExpiresAt is 0 at level 0
	// and at or before StartsAt when the level is no longer enforced (a
	// step down after its enforcement ran out).
	StartsAt  int64
	ExpiresAt int64
	Evidence  []Evidence
	IssuedBy  string
	Reason    string
}

// Table is the abuse state of one decisions partition.
type Table struct {
	cfg       Config
	partition int32
	keys      map[string]*State
	// lastKeys is how many keys the last committed transaction changed:
	// the next one's maps start at that size instead of growing to it by
	// rehashing, which a backlog of new keys would pay on every
	// transaction.
	lastKeys int
}

// NewTable returns the table of partition p, holding states (restored from
// the changelog).
func NewTable(cfg Config, p int32, states map[string]State) *Table {
	cfg.SetDefaults()
	t := &Table{cfg: cfg, partition: p, keys: make(map[string]*State, len(states))}
	for id, s := range states {
		s := s
		t.keys[id] = &s
	}
	return t
}

// Len is the number of keys held.
func (t *Table) Len() int { return len(t.keys) }

// Get returns a key's state.
func (t *Table) Get(keyID string) (State, bool) {
	s, ok := t.keys[keyID]
	if !ok {
		return State{}, false
	}
	return *s, true
}

// Levels counts the keys at each level whose level is enforced at now.
func (t *Table) Levels(now time.Time) [MaxLevel + 1]int {
	var n [MaxLevel + 1]int
	us := now.UnixMicro()
	for _, s := range t.keys {
		if s.Enforced(us) {
			n[s.Level]++
		}
	}
	return n
}

// VolumeKeys counts the keys volume_ceiling fired on within the last
// window before now.
func (t *Table) VolumeKeys(now time.Time) int {
	cut := now.Add(-t.cfg.Window).UnixMicro()
	n := 0
	for _, s := range t.keys {
		if s.VolumeAt > cut {
			n++
		}
	}
	return n
}

// Begin starts a transaction on the table.
func (t *Table) Begin() *Txn {
	return &Txn{t: t, keys: make(map[string]*State, t.lastKeys), touched: make(map[string]bool, t.lastKeys), firings: map[string]int{}}
}

// Txn is a set of changes to a Table, invisible to it until Commit.
type Txn struct {
	t       *Table
	keys    map[string]*State
	deleted map[string]bool
	touched map[string]bool
	steps   []Step
	firings map[string]int
}

// state returns the transaction's copy of a key's state; nil when the key
// has none and create is false.
func (x *Txn) state(keyID string, create bool) *State {
	if s, ok := x.keys[keyID]; ok {
		return s
	}
	if b, ok := x.t.keys[keyID]; ok && !x.deleted[keyID] {
		c := *b
		x.keys[keyID] = &c
		return &c
	}
	if !create {
		return nil
	}
	delete(x.deleted, keyID)
	c := &State{}
	x.keys[keyID] = c
	return c
}

// Observe counts a decision observed at now (wall clock). Call it only for
// decisions counted once (not duplicates), in the partition's order.
func (x *Txn) Observe(d *Decision, now time.Time) {
	if d.KeyID == "" {
		return // anonymous: penalties act on keys
	}
	us := now.UnixMicro()
	if d.Reason == ReasonAllowlisted {
		// Allowlisted keys are never penalised: one penalised since
		// (gateways answer allowlisted before a penalty) is lifted.
		if s := x.state(d.KeyID, false); s != nil && s.Level > LevelNone && d.TimeMicros > s.LiftedAt {
			x.lift(d.KeyID, s, Lift{KeyID: d.KeyID, TimeMicros: d.TimeMicros, Actor: "allowlist",
				Reason: "the key is allowlisted: allowlisted keys are never penalised"}, now)
		}
		return
	}
	if x.t.cfg.Off {
		return
	}
	s := x.state(d.KeyID, true)
	s.Touched = us
	if d.Tenant != "" {
		s.Tenant = d.Tenant
	}
	if d.KeyPrefix != "" {
		s.KeyPrefix = d.KeyPrefix
	}
	if d.TimeMicros < s.Floor {
		return
	}
	t := d.TimeMicros
	ignored := t > s.RetryFrom && t < s.RetryUntil
	if !d.Allowed && d.RetryAfter > 0 {
		until := t + d.RetryAfter*1_000_000
		switch {
		case t >= s.RetryUntil: // after the running one: a new backoff
			s.RetryFrom, s.RetryUntil = t, until
		case until >= s.RetryFrom: // overlapping: the union
			s.RetryFrom, s.RetryUntil = min(s.RetryFrom, t), max(s.RetryUntil, until)
		}
	}
	if s.add(x.t.cfg.width(), t, !d.Allowed, ignored) {
		x.touched[d.KeyID] = true
	}
}

// add counts one decision in the ring; false when its sub-window is older
// than every one the ring holds.
func (s *State) add(width, t int64, rejected, ignored bool) bool {
	start := windows.FloorDiv(t, width) * width
	b := &s.Ring[windows.Mod(windows.FloorDiv(t, width), Buckets)]
	switch {
	case b.Requests == 0 || b.Start < start:
		*b = Bucket{Start: start, First: t, Last: t}
	case b.Start > start:
		return false
	}
	b.Requests++
	if rejected {
		b.Rejected++
	}
	if ignored {
		b.Ignored++
	}
	b.First, b.Last = min(b.First, t), max(b.Last, t)
	return true
}

// sums adds up the ring's sub-windows within the window ending with the
// newest one.
func (s *State) sums(cfg *Config) (e Evidence, newest int64) {
	w := cfg.width()
	newest = -1 << 63
	for _, b := range s.Ring {
		if b.Requests > 0 && b.Start > newest {
			newest = b.Start
		}
	}
	for _, b := range s.Ring {
		if b.Requests == 0 || b.Start <= newest-Buckets*w {
			continue
		}
		e.Requests += b.Requests
		e.Rejected += b.Rejected
		e.Ignored += b.Ignored
		if e.First == 0 || b.First < e.First {
			e.First = b.First
		}
		e.Last = max(e.Last, b.Last)
	}
	e.WindowSeconds = int64(cfg.Window / time.Second)
	if cfg.Window > 0 {
		e.RatePerSecond = float64(e.Requests) / cfg.Window.Seconds()
	}
	return e, e.Last
}

// detect returns the evidence of every enabled detector that fires on s.
func (c *Config) detect(s *State) (fired []Evidence, newest int64) {
	e, newest := s.sums(c)
	if e.Requests == 0 {
		return nil, newest
	}
	if c.enabled(DetectorBackoffIgnored) {
		share := float64(e.Ignored) / float64(e.Requests)
		if e.Ignored >= c.BackoffMinIgnored && share >= c.BackoffMinShare {
			f := e
			f.Detector, f.Ratio = DetectorBackoffIgnored, share
			fired = append(fired, f)
		}
	}
	if c.enabled(DetectorSustainedRejection) {
		ratio := float64(e.Rejected) / float64(e.Requests)
		if e.Requests >= c.RejectionMinRequests && ratio >= c.RejectionRatio {
			f := e
			f.Detector, f.Ratio = DetectorSustainedRejection, ratio
			fired = append(fired, f)
		}
	}
	if c.enabled(DetectorVolumeCeiling) && e.RatePerSecond > c.VolumeCeiling {
		f := e
		f.Detector = DetectorVolumeCeiling
		fired = append(fired, f)
	}
	return fired, newest
}

// Evaluate runs the detectors on every key the transaction observed a
// decision of, and climbs the ladder for those they fire on.
func (x *Txn) Evaluate(now time.Time) {
	if len(x.touched) == 0 {
		return
	}
	ids := make([]string, 0, len(x.touched))
	for id := range x.touched {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	clear(x.touched)
	us := now.UnixMicro()
	for _, id := range ids {
		s := x.state(id, false)
		if s == nil {
			continue
		}
		fired, newest := x.t.cfg.detect(s)
		if len(fired) == 0 {
			continue
		}
		for _, f := range fired {
			x.firings[f.Detector]++
			if f.Detector == DetectorVolumeCeiling {
				s.VolumeAt = us
			}
		}
		// The evidence is spent: the next firing needs new decisions.
		s.Ring = [Buckets]Bucket{}
		s.LastFiring = us
		x.climb(id, s, fired, newest, now)
	}
}

// climb moves a key up after a firing.
func (x *Txn) climb(id string, s *State, fired []Evidence, newest int64, now time.Time) {
	us := now.UnixMicro()
	next := s.Level + 1
	if s.Level == MaxLevel {
		if s.Enforced(us) {
			return // at the top: the firing only postpones the step down
		}
		next = MaxLevel
	}
	names := make([]string, len(fired))
	for i, f := range fired {
		names[i] = f.Detector
	}
	prev := s.Level
	s.Level, s.Step, s.Since = next, s.Step+1, us
	s.Until = now.Add(x.t.cfg.Duration(next)).UnixMicro()
	s.Floor = max(s.Floor, newest+x.t.cfg.Grace.Microseconds())
	st := x.newStep(id, s, prev, LevelAction(next), us)
	st.Evidence = fired
	st.IssuedBy = strings.Join(names, ",")
	st.Reason = describe(fired)
	x.steps = append(x.steps, st)
}

func (x *Txn) newStep(id string, s *State, prev int, action string, us int64) Step {
	st := Step{KeyID: id, KeyPrefix: s.KeyPrefix, Tenant: s.Tenant, Step: s.Step, Level: s.Level, Previous: prev,
		Action: action, StartsAt: us}
	if s.Level > LevelNone {
		st.ExpiresAt = s.Until
	}
	if s.Level == LevelReduced {
		st.Factor = x.t.cfg.Factor
	}
	return st
}

// describe says in words what the detectors saw.
func describe(fired []Evidence) string {
	parts := make([]string, 0, len(fired))
	for _, f := range fired {
		switch f.Detector {
		case DetectorBackoffIgnored:
			parts = append(parts, fmt.Sprintf("%d of %d requests in %ds arrived while a Retry-After was running (%.0f%%)",
				f.Ignored, f.Requests, f.WindowSeconds, 100*f.Ratio))
		case DetectorSustainedRejection:
			parts = append(parts, fmt.Sprintf("%d of %d requests in %ds were rejected (%.0f%%)",
				f.Rejected, f.Requests, f.WindowSeconds, 100*f.Ratio))
		case DetectorVolumeCeiling:
			parts = append(parts, fmt.Sprintf("%.0f requests/s over %ds", f.RatePerSecond, f.WindowSeconds))
		}
	}
	return strings.Join(parts, "; ")
}

// Lift applies an operator's lift at now (wall clock); it reports whether
// it changed anything (false for a lift already applied).
func (x *Txn) Lift(l Lift, now time.Time) bool {
	if l.KeyID == "" {
		return false
	}
	s := x.state(l.KeyID, true)
	if l.TimeMicros <= s.LiftedAt {
		return false
	}
	if s.Tenant == "" {
		s.Tenant = l.Tenant
	}
	s.Touched = max(s.Touched, now.UnixMicro())
	x.lift(l.KeyID, s, l, now)
	return true
}

func (x *Txn) lift(id string, s *State, l Lift, now time.Time) {
	us := now.UnixMicro()
	prev := s.Level
	s.LiftedAt = l.TimeMicros
	s.Level, s.Step, s.Since, s.Until, s.LastFiring = LevelNone, s.Step+1, us, 0, 0
	s.Floor = max(s.Floor, l.TimeMicros+1) // at or before the lift: never again
	s.RetryFrom, s.RetryUntil = 0, 0
	s.Ring = [Buckets]Bucket{}
	delete(x.touched, id)
	st := x.newStep(id, s, prev, ActionLifted, us)
	st.IssuedBy, st.Reason = l.Actor, l.Reason
	x.steps = append(x.steps, st)
}

// Tick steps down the keys that were quiet for QuietPeriod and drops the
// state of level-0 keys idle for Idle, at now (wall clock).
func (x *Txn) Tick(now time.Time) {
	us := now.UnixMicro()
	cfg := &x.t.cfg
	quiet, idle, remember := cfg.QuietPeriod.Microseconds(), cfg.Idle.Microseconds(), cfg.Remember.Microseconds()
	var down, evict []string
	check := func(id string, s *State) {
		switch {
		case s.Level > LevelNone && us-max(s.Since, s.LastFiring) >= quiet:
			down = append(down, id)
		case s.Level == LevelNone && us-s.Touched >= idle && us-s.Floor >= idle && us >= s.RetryUntil &&
			(s.Step == 0 || us-s.Since >= remember):
			evict = append(evict, id)
		}
	}
	for id, s := range x.t.keys {
		if c, ok := x.keys[id]; ok {
			s = c
		} else if x.deleted[id] {
			continue
		}
		check(id, s)
	}
	for id, s := range x.keys {
		if _, ok := x.t.keys[id]; !ok {
			check(id, s)
		}
	}
	slices.Sort(down)
	for _, id := range down {
		s := x.state(id, false)
		prev := s.Level
		s.Level, s.Step, s.Since = s.Level-1, s.Step+1, us
		if s.Level == LevelNone {
			s.Until = 0
		} else {
			s.Until = min(s.Until, now.Add(cfg.Duration(s.Level)).UnixMicro())
		}
		st := x.newStep(id, s, prev, ActionStepDown, us)
		st.IssuedBy = "ladder"
		st.Reason = fmt.Sprintf("no detector fired for %v", cfg.QuietPeriod)
		x.steps = append(x.steps, st)
	}
	for _, id := range evict {
		if x.deleted == nil {
			x.deleted = map[string]bool{}
		}
		x.deleted[id] = true
		delete(x.keys, id)
		delete(x.touched, id)
	}
}

// Change is one key's state a transaction writes; Deleted for a tombstone.
type Change struct {
	KeyID   string
	State   State
	Deleted bool
}

// Changes returns the transaction's writes, ordered by key_id.
func (x *Txn) Changes() []Change {
	ids := make([]string, 0, len(x.keys)+len(x.deleted))
	for id := range x.keys {
		ids = append(ids, id)
	}
	for id := range x.deleted {
		ids = append(ids, id)
	}
	slices.Sort(ids) // the ids, not the states: a State is a few hundred bytes
	out := make([]Change, len(ids))
	for i, id := range ids {
		if s, ok := x.keys[id]; ok {
			out[i] = Change{KeyID: id, State: *s}
		} else {
			out[i] = Change{KeyID: id, Deleted: true}
		}
	}
	return out
}

// Steps returns the steps the transaction took, in order.
func (x *Txn) Steps() []Step { return x.steps }

// Firings returns how many times each detector fired in the transaction.
func (x *Txn) Firings() map[string]int { return x.firings }

// Empty reports whether the transaction changes nothing.
func (x *Txn) Empty() bool { return len(x.keys) == 0 && len(x.deleted) == 0 }

// Commit applies the transaction to the table. Call it only once the
// Kafka transaction carrying Changes() and Steps() committed; the Txn is
// spent afterwards.
func (x *Txn) Commit() {
	x.t.lastKeys = len(x.keys)
	for id, s := range x.keys {
		x.t.keys[id] = s
	}
	for id := range x.deleted {
		delete(x.t.keys, id)
	}
	*x = Txn{}
}
