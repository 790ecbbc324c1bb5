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
// within Idle, penalised, or that took a step within Remember, in a flat
// table of pointer-free slots that the Go collector does not scan.
// Changes are made in a Txn, invisible to the Table until Commit, which is what the aggregator's Kafka transaction
// needs (package windows does the same for usage rows). Nothing here starts
// goroutines or is safe for concurrent use: one partition's table is owned
// by one processing loop.
package abuse

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/intern"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/configs"
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
	configs.DefaultPositive(&c.Window, time.Minute)
	configs.DefaultPositive(&c.ReducedFor, 5*time.Minute)
	configs.DefaultPositive(&c.CooldownFor, 15*time.Minute)
	configs.DefaultPositive(&c.BlockFor, 24*time.Hour)
	configs.DefaultPositive(&c.QuietPeriod, time.Hour)
	configs.DefaultPositive(&c.Grace, 2*time.Second)
	configs.DefaultPositive(&c.Idle, 2*c.Window)
	configs.DefaultPositive(&c.Remember, 7*24*time.Hour)
	configs.DefaultPositive(&c.BackoffMinIgnored, 20)
	configs.DefaultPositive(&c.BackoffMinShare, 0.5)
	configs.DefaultPositive(&c.RejectionMinRequests, 100)
	configs.DefaultPositive(&c.RejectionRatio, 0.9)
	configs.DefaultPositive(&c.VolumeCeiling, 10_000)
	configs.DefaultPositive(&c.Factor, 0.5)
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

// slot is one key's State as a Table holds it: its strings interned, so
// that it holds no pointer and the collector never scans the table.
type slot struct {
	tenant, prefix uint32 // interned in Table.strs; 0 for ""
	level          int32
	live           bool
	step           uint64
	since, until   int64
	lastFiring     int64
	volumeAt       int64
	floor          int64
	liftedAt       int64
	retryFrom      int64
	retryUntil     int64
	touched        int64
	ring           [Buckets]Bucket
}

// Table is the abuse state of one decisions partition. Its keys' states
// are pages of pointer-free slots indexed by the key's interned id, so
// however many keys it holds the collector scans none of them, and a key
// new to the table costs one insert (its key_id into the interner) at
// commit.
//
// The table holds every key whose state a committed transaction wrote and
// Tick has not dropped since: a key at level 0 is dropped once it was
// unseen for Idle, or, if it ever took a step, Remember after its last
// step; a key above level 0 is never dropped (it steps down first). Ids
// and slots of dropped keys are reused, so what it holds is bounded by the
// keys seen within Idle plus those penalised within Remember.
type Table struct {
	cfg       Config
	partition int32
	keys      *intern.Table // key_ids; a key's id indexes slots, all below keys.IDs()
	strs      *intern.Table // tenants and key prefixes
	slots     intern.Pages[slot]
	n         int // keys held
	// gen counts commits: an id a transaction found at one gen still
	// names its key while gen has not moved.
	gen uint64
	// lastKeys is how many keys the last committed transaction changed:
	// the next one's map and slices start at that size instead of growing
	// to it, which a backlog of new keys would pay on every transaction.
	lastKeys int
}

// NewTable returns the table of partition p, holding states (restored from
// the changelog).
func NewTable(cfg Config, p int32, states map[string]State) *Table {
	cfg.SetDefaults()
	t := &Table{cfg: cfg, partition: p, keys: intern.New(), strs: intern.New()}
	for id, s := range states {
		t.add(id, &s)
	}
	return t
}

// add holds s as key's state, a key the table does not hold.
func (t *Table) add(key string, s *State) {
	id := t.keys.RefString(key)
	t.slots.Grow(int(id) + 1)
	*t.slots.At(id) = slot{live: true}
	t.n++
	t.set(id, s)
}

// set writes s into slot id.
func (t *Table) set(id uint32, s *State) {
	e := t.slots.At(id)
	e.tenant = t.restr(e.tenant, s.Tenant)
	e.prefix = t.restr(e.prefix, s.KeyPrefix)
	e.level, e.step, e.since, e.until = int32(s.Level), s.Step, s.Since, s.Until
	e.lastFiring, e.volumeAt, e.floor, e.liftedAt = s.LastFiring, s.VolumeAt, s.Floor, s.LiftedAt
	e.retryFrom, e.retryUntil, e.touched, e.ring = s.RetryFrom, s.RetryUntil, s.Touched, s.Ring
}

// restr is the interned id of str, given old, the id it replaces.
func (t *Table) restr(old uint32, str string) uint32 {
	if t.strs.Str(old) == str {
		return old
	}
	var id uint32
	if str != "" {
		id = t.strs.RefString(str)
	}
	t.strs.Unref(old)
	return id
}

// get copies slot id into s; its strings alias the interner's arena,
// which never changes.
func (t *Table) get(id uint32, s *State) {
	e := t.slots.At(id)
	*s = State{Tenant: t.strs.Str(e.tenant), KeyPrefix: t.strs.Str(e.prefix), Level: int(e.level), Step: e.step,
		Since: e.since, Until: e.until, LastFiring: e.lastFiring, VolumeAt: e.volumeAt, Floor: e.floor,
		LiftedAt: e.liftedAt, RetryFrom: e.retryFrom, RetryUntil: e.retryUntil, Touched: e.touched, Ring: e.ring}
}

// remove drops slot id and its key.
func (t *Table) remove(id uint32) {
	e := t.slots.At(id)
	t.strs.Unref(e.tenant)
	t.strs.Unref(e.prefix)
	t.keys.Unref(id)
	*e = slot{}
	t.n--
}

// Len is the number of keys held.
func (t *Table) Len() int { return t.n }

// Get returns a key's state.
func (t *Table) Get(keyID string) (State, bool) {
	id := t.keys.FindString(keyID)
	if id == 0 {
		return State{}, false
	}
	var s State
	t.get(id, &s)
	return s, true
}

// Levels counts the keys at each level whose level is enforced at now.
func (t *Table) Levels(now time.Time) [MaxLevel + 1]int {
	var n [MaxLevel + 1]int
	us := now.UnixMicro()
	for i := 1; i < t.keys.IDs(); i++ { // id 0 is none
		if e := t.slots.At(uint32(i)); e.live && e.level > LevelNone && e.until > us {
			n[e.level]++
		}
	}
	return n
}

// VolumeKeys counts the keys volume_ceiling fired on within the last
// window before now.
func (t *Table) VolumeKeys(now time.Time) int {
	cut := now.Add(-t.cfg.Window).UnixMicro()
	n := 0
	for i := 1; i < t.keys.IDs(); i++ { // id 0 is none
		if e := t.slots.At(uint32(i)); e.live && e.volumeAt > cut {
			n++
		}
	}
	return n
}

// Begin starts a transaction on the table.
func (t *Table) Begin() *Txn {
	return &Txn{t: t, gen: t.gen, list: make([]entry, 0, t.lastKeys), byKey: make(map[string]int32, t.lastKeys),
		touched: make([]int32, 0, t.lastKeys), firings: map[string]int{}}
}

// entry is a key's state as a transaction sees it.
type entry struct {
	State
	key string
	// id is the table's id of the key when the transaction read it (0:
	// the table did not hold it).
	id uint32
	// present: the key has a state; false once Tick dropped it.
	present bool
	// touched: observed since the last Evaluate (listed in Txn.touched).
	touched bool
}

// Txn is a set of changes to a Table, invisible to it until Commit.
type Txn struct {
	t   *Table
	gen uint64 // the table's gen at Begin
	// list holds, by value, every key whose state the transaction read,
	// wrote or dropped; byKey finds them.
	list    []entry
	byKey   map[string]int32
	touched []int32 // indexes in list
	steps   []Step
	firings map[string]int
}

// entry is the index in x.list of key's state; -1 when the key has none
// and create is false. A *State into the list is good until the next key
// is added.
func (x *Txn) entry(key string, create bool) int32 {
	if i, ok := x.byKey[key]; ok {
		e := &x.list[i]
		if !e.present {
			if !create {
				return -1
			}
			e.present, e.State = true, State{}
		}
		return i
	}
	e := entry{key: key, present: true}
	if e.id = x.t.keys.FindString(key); e.id != 0 {
		e.key = x.t.keys.Str(e.id)
		x.t.get(e.id, &e.State)
	} else if !create {
		return -1
	}
	i := int32(len(x.list))
	x.list = append(x.list, e)
	x.byKey[e.key] = i
	return i
}

// drop deletes key's state in the transaction.
func (x *Txn) drop(key string) {
	i, ok := x.byKey[key]
	if !ok {
		i = int32(len(x.list))
		x.list = append(x.list, entry{key: key, id: x.t.keys.FindString(key)})
		x.byKey[key] = i
	}
	e := &x.list[i]
	e.present, e.touched, e.State = false, false, State{}
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
		if i := x.entry(d.KeyID, false); i >= 0 && x.list[i].Level > LevelNone && d.TimeMicros > x.list[i].LiftedAt {
			x.lift(i, Lift{KeyID: d.KeyID, TimeMicros: d.TimeMicros, Actor: "allowlist",
				Reason: "the key is allowlisted: allowlisted keys are never penalised"}, now)
		}
		return
	}
	if x.t.cfg.Off {
		return
	}
	i := x.entry(d.KeyID, true)
	if x.t.cfg.observe(&x.list[i].State, d, us) {
		x.touch(i)
	}
}

// observe records decision d, seen at us, in s; it reports whether the
// detectors have new evidence of s to look at.
func (c *Config) observe(s *State, d *Decision, us int64) bool {
	s.Touched = us
	if d.Tenant != "" {
		s.Tenant = d.Tenant
	}
	if d.KeyPrefix != "" {
		s.KeyPrefix = d.KeyPrefix
	}
	if d.TimeMicros < s.Floor {
		return false
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
	return s.add(c.width(), t, !d.Allowed, ignored)
}

// touch lists entry i for the next Evaluate.
func (x *Txn) touch(i int32) {
	if e := &x.list[i]; !e.touched {
		e.touched = true
		x.touched = append(x.touched, i)
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
	// fire adds the detector's evidence (ratio: the share it measured) when
	// it is enabled and fires.
	fire := func(detector string, ratio float64, fires bool) {
		if fires && c.enabled(detector) {
			f := e
			f.Detector, f.Ratio = detector, ratio
			fired = append(fired, f)
		}
	}
	ignored := float64(e.Ignored) / float64(e.Requests)
	rejected := float64(e.Rejected) / float64(e.Requests)
	fire(DetectorBackoffIgnored, ignored, e.Ignored >= c.BackoffMinIgnored && ignored >= c.BackoffMinShare)
	fire(DetectorSustainedRejection, rejected, e.Requests >= c.RejectionMinRequests && rejected >= c.RejectionRatio)
	fire(DetectorVolumeCeiling, 0, e.RatePerSecond > c.VolumeCeiling)
	return fired, newest
}

// Evaluate runs the detectors on every key the transaction observed a
// decision of, and climbs the ladder for those they fire on.
func (x *Txn) Evaluate(now time.Time) {
	if len(x.touched) == 0 {
		return
	}
	ids := make([]int32, 0, len(x.touched))
	for _, i := range x.touched {
		if e := &x.list[i]; e.touched {
			e.touched = false
			ids = append(ids, i)
		}
	}
	x.touched = x.touched[:0]
	slices.SortFunc(ids, func(a, b int32) int { return strings.Compare(x.list[a].key, x.list[b].key) })
	us := now.UnixMicro()
	for _, i := range ids {
		e := &x.list[i]
		if !e.present {
			continue
		}
		s := &e.State
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
		x.climb(e.key, s, fired, newest, now)
	}
}

// climb moves a key up after a firing.
func (x *Txn) climb(id string, s *State, fired []Evidence, newest int64, now time.Time) {
	if st, ok := x.t.cfg.climb(id, s, fired, newest, now); ok {
		x.steps = append(x.steps, st)
	}
}

// climb moves s (the state of key id) up a level after the detectors in
// fired fired at now, newest the time of the newest decision they saw;
// it returns the step taken, or false when s is at the top and still
// enforced (the firing only postpones the step down).
func (c *Config) climb(id string, s *State, fired []Evidence, newest int64, now time.Time) (Step, bool) {
	us := now.UnixMicro()
	next := s.Level + 1
	if s.Level == MaxLevel {
		if s.Enforced(us) {
			return Step{}, false
		}
		next = MaxLevel
	}
	names := make([]string, len(fired))
	for i, f := range fired {
		names[i] = f.Detector
	}
	prev := s.Level
	s.Level, s.Step, s.Since = next, s.Step+1, us
	s.Until = now.Add(c.Duration(next)).UnixMicro()
	s.Floor = max(s.Floor, newest+c.Grace.Microseconds())
	st := c.newStep(id, s, prev, LevelAction(next), us)
	st.Evidence = fired
	st.IssuedBy = strings.Join(names, ",")
	st.Reason = describe(fired)
	return st, true
}

// lift takes s (the state of key id) down to no level for the operator's
// lift l at now and returns the step.
func (c *Config) lift(id string, s *State, l Lift, now time.Time) Step {
	us := now.UnixMicro()
	prev := s.Level
	s.LiftedAt = l.TimeMicros
	s.Level, s.Step, s.Since, s.Until, s.LastFiring = LevelNone, s.Step+1, us, 0, 0
	s.Floor = max(s.Floor, l.TimeMicros+1) // at or before the lift: never again
	s.RetryFrom, s.RetryUntil = 0, 0
	s.Ring = [Buckets]Bucket{}
	st := c.newStep(id, s, prev, ActionLifted, us)
	st.IssuedBy, st.Reason = l.Actor, l.Reason
	return st
}

// stepDown takes s (the state of key id), quiet for QuietPeriod, one level
// down at now and returns the step.
func (c *Config) stepDown(id string, s *State, now time.Time) Step {
	us := now.UnixMicro()
	prev := s.Level
	s.Level, s.Step, s.Since = s.Level-1, s.Step+1, us
	if s.Level == LevelNone {
		s.Until = 0
	} else {
		s.Until = min(s.Until, now.Add(c.Duration(s.Level)).UnixMicro())
	}
	st := c.newStep(id, s, prev, ActionStepDown, us)
	st.IssuedBy = "ladder"
	st.Reason = fmt.Sprintf("no detector fired for %v", c.QuietPeriod)
	return st
}

func (c *Config) newStep(id string, s *State, prev int, action string, us int64) Step {
	st := Step{KeyID: id, KeyPrefix: s.KeyPrefix, Tenant: s.Tenant, Step: s.Step, Level: s.Level, Previous: prev,
		Action: action, StartsAt: us}
	if s.Level > LevelNone {
		st.ExpiresAt = s.Until
	}
	if s.Level == LevelReduced {
		st.Factor = c.Factor
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
	i := x.entry(l.KeyID, true)
	s := &x.list[i].State
	if l.TimeMicros <= s.LiftedAt {
		return false
	}
	s.Tenant = cmp.Or(s.Tenant, l.Tenant)
	s.Touched = max(s.Touched, now.UnixMicro())
	x.lift(i, l, now)
	return true
}

func (x *Txn) lift(i int32, l Lift, now time.Time) {
	e := &x.list[i]
	e.touched = false
	x.steps = append(x.steps, x.t.cfg.lift(e.key, &e.State, l, now))
}

// Tick steps down the keys that were quiet for QuietPeriod and drops the
// state of level-0 keys idle for Idle, at now (wall clock).
func (x *Txn) Tick(now time.Time) {
	us := now.UnixMicro()
	cfg := &x.t.cfg
	quiet, idle, remember := cfg.QuietPeriod.Microseconds(), cfg.Idle.Microseconds(), cfg.Remember.Microseconds()
	var down, evict []string
	check := func(id string, level int, step uint64, since, lastFiring, touched, floor, retryUntil int64) {
		switch {
		case level > LevelNone && us-max(since, lastFiring) >= quiet:
			down = append(down, id)
		case level == LevelNone && us-touched >= idle && us-floor >= idle && us >= retryUntil &&
			(step == 0 || us-since >= remember):
			evict = append(evict, id)
		}
	}
	// The table's keys, as the transaction sees them, then the keys new
	// in the transaction.
	x.sync()
	over := make(map[uint32]int32, len(x.list))
	for i := range x.list {
		if e := &x.list[i]; e.id != 0 {
			over[e.id] = int32(i)
		}
	}
	for id := 1; id < x.t.keys.IDs(); id++ { // id 0 is none
		e := x.t.slots.At(uint32(id))
		if !e.live {
			continue
		}
		if i, ok := over[uint32(id)]; ok {
			if s := &x.list[i]; s.present {
				check(s.key, s.Level, s.Step, s.Since, s.LastFiring, s.Touched, s.Floor, s.RetryUntil)
			}
			continue
		}
		check(x.t.keys.Str(uint32(id)), int(e.level), e.step, e.since, e.lastFiring, e.touched, e.floor, e.retryUntil)
	}
	for i := range x.list {
		if s := &x.list[i]; s.present && s.id == 0 {
			check(s.key, s.Level, s.Step, s.Since, s.LastFiring, s.Touched, s.Floor, s.RetryUntil)
		}
	}
	slices.Sort(down)
	for _, id := range down {
		x.steps = append(x.steps, cfg.stepDown(id, &x.list[x.entry(id, false)].State, now))
	}
	for _, id := range evict {
		x.drop(id)
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
	idx := make([]int32, len(x.list))
	for i := range idx {
		idx[i] = int32(i)
	}
	slices.SortFunc(idx, func(a, b int32) int { return strings.Compare(x.list[a].key, x.list[b].key) })
	out := make([]Change, len(idx))
	for j, i := range idx {
		if e := &x.list[i]; e.present {
			out[j] = Change{KeyID: e.key, State: e.State}
		} else {
			out[j] = Change{KeyID: e.key, Deleted: true}
		}
	}
	return out
}

// Steps returns the steps the transaction took, in order.
func (x *Txn) Steps() []Step { return x.steps }

// Firings returns how many times each detector fired in the transaction.
func (x *Txn) Firings() map[string]int { return x.firings }

// Empty reports whether the transaction changes nothing.
func (x *Txn) Empty() bool { return len(x.list) == 0 }

// sync finds the table's ids of the transaction's keys again when another
// transaction committed since they were read.
func (x *Txn) sync() {
	if x.gen == x.t.gen {
		return
	}
	for i := range x.list {
		x.list[i].id = x.t.keys.FindString(x.list[i].key)
	}
	x.gen = x.t.gen
}

// Commit applies the transaction to the table. Call it only once the
// Kafka transaction carrying Changes() and Steps() committed; the Txn is
// spent afterwards.
func (x *Txn) Commit() {
	x.sync()
	t := x.t
	t.lastKeys = len(x.list)
	for i := range x.list {
		e := &x.list[i]
		switch id := e.id; {
		case e.present && id != 0:
			t.set(id, &e.State)
		case e.present:
			t.add(e.key, &e.State)
		case id != 0:
			t.remove(id)
		}
	}
	t.gen++
	*x = Txn{}
}
