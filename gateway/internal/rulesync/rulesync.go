// Package rulesync keeps a gateway's rules and controls in step with the
// fleet's control plane (fleet mode): it follows the NATS JetStream KV
// buckets the aggregator's operator API writes — tollgate_rules (key
// active: the ruleset), tollgate_blocklist (blocked, penalised and
// allowlisted keys) and tollgate_overrides — through package fleetkv, and
// applies every change at once: a ruleset is swapped whole, a control
// change is one guard.Controls edit — the control changes of a burst
// (those the watchers held together) one edit for them all — which does
// not copy the lists (guard.Controls). After every applied change it
// writes a last-known-good copy to disk (lkg.json, written to a temporary
// file, fsynced and renamed), from which a gateway starts when NATS is
// unreachable. The copy is written after the change is in force, by a
// goroutine of its own, so a slow disk never delays the next change; of a
// burst of changes, the newest state is written, at most once per
// Config.SaveInterval, once the changes pause (or every ten intervals
// while they keep coming), and at the watch loop's tick rather than on
// the change's own path.
//
// It also listens on tollgatev1.SubjectCounters, where the operator API
// announces a reset or a quota grant, and tells Config.OnCountersChanged,
// so that the gateway's fast path drops what it derived from those
// counters (a core NATS subscription, kept by nats.go across reconnects).
//
// # What arrives, and what is refused
//
// A ruleset is parsed and validated as a rules file is (package rulefile);
// an invalid one is refused as a whole, logged with every problem's rule,
// field and line, reported to Config.OnRefused (the gateway's reload-error
// metric), and the running ruleset stays. Its version is the one the
// operator API assigned (RulesEntry.Version), not the document's own.
// Blocklist entries and overrides become guard.Controls as fleetkv.Entries
// says: block → Block (403 KEY_BLOCKED), penalty → a guard.Penalty (429
// PENALTY, Retry-After the time left), allow → Allow, an override a key
// or tenant override. Entries are named by key_id, so decisions on
// blocked keys need no Redis round trip.
//
// # Corrupt entries
//
// An entry that does not decode, or whose KV key does not match its
// content (written to NATS by hand, or damaged), is corrupt. Every gateway
// treats one the same way, from the bucket's content alone — never from
// its own history, which differs between a gateway that ran through the
// change, one that restarts from its last-known-good copy and a new one —
// so that corruption never splits the fleet: a corrupt blocklist entry
// blocks its key_id until it is replaced or deleted, a corrupt
// allowlisting or override applies nowhere (fleetkv.Entries), and a
// corrupt (or refused) active ruleset leaves the running ruleset in force;
// a gateway that (re)syncs meanwhile puts in force the newest version in
// the rules bucket's history that decodes and passes — the one the others
// run. The copy on disk keeps the corrupt blocklist entries' blocks.
//
// Each is logged (once per KV key and revision) with the operator API call
// that repairs it, and counted in Status().Corrupt (the gateway's
// tollgate_nats_corrupt_entries gauge). The operator API shows such
// entries (409 RULES_CORRUPT or ENTRY_CORRUPT) and replaces or deletes
// them.
//
// # Reconnects
//
// On every (re)connect the buckets are read afresh (fleetkv.Conn.Follow),
// and the Syncer puts the whole state they hold in force with one
// Controls.Replace: a key deleted while the gateway was disconnected is
// gone after the resync. While NATS is unreachable the gateway keeps what
// it has. Until the buckets exist (the aggregator creates them) it retries
// every few seconds, logging the problem once.
//
// # Goroutines
//
// Run owns the NATS connection (nats.go runs its reader, flusher and
// callback dispatcher goroutines for it, and fleetkv a goroutine per ended
// session that stops its watchers) and closes it, waiting for those,
// before it returns; it also waits for the saver, which writes the
// last-known-good copy and finishes the last one first, and for the
// Config.Announcer, which deletes the gateway's presence entry first. Everything else
// happens on Run's goroutine, which owns the Syncer's state: it needs no
// lock.
package rulesync

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway/internal/rulefile"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// ErrConfig is wrapped by New's errors for an unusable Config.
var ErrConfig = errors.New("rulesync: invalid configuration")

// Timings.
const (
	// DefaultReconnectWait is Config.ReconnectWait's default.
	DefaultReconnectWait = fleetkv.DefaultReconnectWait
	// historyTimeout bounds reading the rules bucket's history.
	historyTimeout = 10 * time.Second
	// DefaultSaveInterval is Config.SaveInterval's default.
	DefaultSaveInterval = time.Second
)

// Config configures a Syncer.
type Config struct {
	// URL is the NATS server URL (several comma-separated), required.
	URL string
	// Name is the NATS connection's name, shown by the server's monitoring
	// (e.g. tollgate-gateway-<gateway_id>).
	Name string
	// Dir is the directory of the last-known-good copy, Dir/lkg.json,
	// created (0700) at the first write; required. The copy holds the
	// ruleset's source, which may name raw API keys in its registry, so it
	// is written 0600.
	Dir string
	// Controls receive the blocklist, penalties, allowlist and overrides;
	// required. The Syncer replaces them whole at every (re)sync: in fleet
	// mode nothing else should write them.
	Controls *guard.Controls
	// Apply receives every ruleset put in force, on Run's goroutine;
	// required. After a resync that finds the ruleset already in force it
	// is called again with the same *rulefile.Ruleset: it now comes from
	// NATS.
	Apply func(*rulefile.Ruleset)
	// Check is what a compiled ruleset must pass besides validation, such
	// as guard.Guard.CheckRules; nil: nothing more.
	Check func(*rules.Ruleset) error
	// OnRefused is told of every refused ruleset, once per version; nil:
	// nobody.
	OnRefused func(error)
	// OnCountersChanged is called when the operator API announces that it
	// reset counters (reset true) or granted them quota
	// (tollgatev1.SubjectCounters), with their names (nil: unknown, every
	// counter), on a goroutine of nats.go's: the gateway drops its fast
	// path's local state of them (guard.Guard.ForgetNames). It must not
	// block. nil: nothing.
	OnCountersChanged func(reset bool, names []string)
	// Log receives the Syncer's lines; nil discards them. Keys are never
	// logged, only key_ids' prefixes.
	Log *slog.Logger
	// ReconnectWait is the pause between two attempts to reach NATS
	// (default DefaultReconnectWait).
	ReconnectWait time.Duration
	// Announcer, when set, keeps the gateway's entry in the presence
	// bucket (tollgate_gateways) on the Syncer's connection: Run runs it
	// and waits for it (it deletes the entry) before closing the
	// connection. nil: no presence.
	Announcer *fleetkv.Announcer
	// SaveInterval is the least time between two encodings and writes of
	// the last-known-good copy (default DefaultSaveInterval): the changes
	// of a burst are in force at once and reach the disk as one write, of
	// the newest state, at the first tick (every second) once the changes
	// have paused for the interval — or have kept coming for ten
	// intervals — or when Run returns (a whole read of the buckets, at
	// start or after a reconnect, is written at once when the interval is
	// over). A fleet of gateways sharing a disk otherwise encodes and
	// fsyncs once per gateway per change.
	SaveInterval time.Duration
}

// Syncer watches the control plane's buckets. Create it with New, call
// LoadLKG (optional) and then Run once.
type Syncer struct {
	cfg Config
	log *slog.Logger

	synced chan struct{} // closed after the first complete read
	nc     atomic.Pointer[fleetkv.Conn]

	syncedFlag  atomic.Bool
	lastApplied atomic.Int64    // Unix ns of the last applied change; 0: none
	corrupt     [3]atomic.Int64 // corrupt entries now, by bucket (inRules, inLists, inOverrides)

	// Owned by Run's goroutine (and by LoadLKG before Run).
	state   state
	applied *rulefile.Ruleset // the ruleset of state.rules
	refused string            // identity of the last refused ruleset
	ladder  ladderLog         // the penalty ladder's moves last logged
	// corruptLogged: the corrupt entries logged, by bucket/key/revision.
	corruptLogged map[string]bool
	// edits are the controls' changes of the burst being read, published
	// together by flush.
	edits  []func(guard.ControlWriter)
	toSave chan []byte // to the saver: the newest copy not written yet
	dirty  bool        // a change is not in the copy handed to the saver
	since  time.Time   // when the copy fell behind (dirty)
	handed time.Time   // when the last copy was handed to the saver
}

// state is what the Syncer holds from the buckets: the blocklist and
// overrides entries, and the ruleset.
type state struct {
	fleetkv.Entries
	rules *tollgatev1.RulesEntry // the ruleset in force; nil: none from NATS
	// corruptRules: the active ruleset entry is corrupt.
	corruptRules bool
}

func newState() state { return state{Entries: fleetkv.NewEntries()} }

// Buckets, as Syncer.corrupt counts them.
const (
	inRules = iota
	inLists
	inOverrides
)

// New returns a Syncer for cfg. It does no I/O and starts nothing.
func New(cfg Config) (*Syncer, error) {
	var missing []string
	if cfg.URL == "" {
		missing = append(missing, "URL")
	}
	if cfg.Dir == "" {
		missing = append(missing, "Dir")
	}
	if cfg.Controls == nil {
		missing = append(missing, "Controls")
	}
	if cfg.Apply == nil {
		missing = append(missing, "Apply")
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("%w: %s required", ErrConfig, strings.Join(missing, ", "))
	}
	configs.DefaultPositive(&cfg.ReconnectWait, DefaultReconnectWait)
	configs.DefaultPositive(&cfg.SaveInterval, DefaultSaveInterval)
	if cfg.OnRefused == nil {
		cfg.OnRefused = func(error) {}
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Syncer{cfg: cfg, log: log, synced: make(chan struct{}), state: newState(), toSave: make(chan []byte, 1)}, nil
}

// Synced is closed once the buckets have been read whole for the first
// time (their ruleset, if any, applied or refused).
func (s *Syncer) Synced() <-chan struct{} { return s.synced }

// Status is what the Syncer reports about itself.
type Status struct {
	// Connected: the NATS connection is up now.
	Connected bool
	// Synced: the buckets have been read whole since the start.
	Synced bool
	// LastApplied is when a change from NATS (or the first sync) was last
	// put in force; zero before the first.
	LastApplied time.Time
	// Corrupt counts the corrupt entries the buckets hold now, by bucket
	// name (tollgatev1.BucketRules: 0 or 1, the active ruleset), as the
	// gateway last read them (see the package's notes).
	Corrupt map[string]int
}

// Status returns the Syncer's status. It is safe to call from any
// goroutine.
func (s *Syncer) Status() Status {
	st := Status{Synced: s.syncedFlag.Load()}
	if nc := s.nc.Load(); nc != nil {
		st.Connected = nc.IsConnected()
	}
	if ns := s.lastApplied.Load(); ns != 0 {
		st.LastApplied = time.Unix(0, ns)
	}
	st.Corrupt = map[string]int{
		tollgatev1.BucketRules:     int(s.corrupt[inRules].Load()),
		tollgatev1.BucketBlocklist: int(s.corrupt[inLists].Load()),
		tollgatev1.BucketOverrides: int(s.corrupt[inOverrides].Load()),
	}
	return st
}

// countCorrupt publishes the state's corrupt entries to Status.
func (s *Syncer) countCorrupt() {
	rules := int64(0)
	if s.state.corruptRules {
		rules = 1
	}
	s.corrupt[inRules].Store(rules)
	s.corrupt[inLists].Store(int64(len(s.state.CorruptLists)))
	s.corrupt[inOverrides].Store(int64(len(s.state.CorruptOverrides)))
}

// Run connects to NATS and keeps the rules and controls in step with the
// buckets until ctx is done; then it closes the connection and returns
// nil. It does not wait for NATS: while NATS is unreachable it retries,
// and the rules and controls in force stay. Run may be called once; it
// fails only for a URL nats.go refuses.
func (s *Syncer) Run(ctx context.Context) error {
	nc, err := fleetkv.Connect(s.cfg.URL, fleetkv.Options{Name: s.cfg.Name, Log: s.log, ReconnectWait: s.cfg.ReconnectWait,
		Down: "the rules and controls in force stay until it is back", Up: "reading the buckets afresh"})
	if err != nil {
		return fmt.Errorf("rulesync: %w", err)
	}
	s.nc.Store(nc)
	if err := nc.OnCountersChanged(s.countersChanged); err != nil {
		nc.Close()
		return fmt.Errorf("rulesync: %w", err)
	}
	var saving, announcing sync.WaitGroup
	saving.Go(s.saver)
	if a := s.cfg.Announcer; a != nil {
		announcing.Go(func() { a.Run(ctx, nc) })
	}
	// In this order on return: the presence entry deleted; the connection
	// closed, with the watchers being stopped; the last copy written.
	defer saving.Wait()
	defer func() {
		if s.dirty {
			s.handOff()
		}
		close(s.toSave)
	}()
	defer nc.Close()
	defer announcing.Wait()
	return nc.Follow(ctx, follower{s}, ladderEndDelay)
}

// follower hands what fleetkv.Conn.Follow reads to the Syncer, on Run's
// goroutine.
type follower struct{ s *Syncer }

func (f follower) Sync(ctx context.Context, snap *fleetkv.Snapshot) { f.s.resync(ctx, snap) }
func (f follower) Change(c fleetkv.Change)                          { f.s.change(c) }
func (f follower) Flush()                                           { f.s.flush() }
func (f follower) Tick(now time.Time) {
	f.s.flushLadderEnds(now)
	f.s.saveDue(now)
}

// countersChanged handles a message on tollgatev1.SubjectCounters.
func (s *Syncer) countersChanged(c tollgatev1.CountersChanged, err error) {
	if err != nil {
		// Unknown counters and kind: every counter's state goes, leases
		// given back (a reset's then come off its fresh counters, the
		// bound docs/gateway.md states).
		s.log.Warn("a counter-change message that does not decode; dropping the fast path's local state of every counter",
			slog.String("error", err.Error()))
	} else {
		s.log.Debug("counters changed by the operator API: dropping the fast path's local state of them",
			slog.String("kind", c.Kind), slog.String("key_id", c.KeyID), slog.Int("counters", len(c.Counters)))
	}
	if s.cfg.OnCountersChanged != nil {
		s.cfg.OnCountersChanged(c.Kind == tollgatev1.CountersReset, c.Counters)
	}
}

// resync puts the whole state read from the buckets in force: the
// ruleset (snap.Rules, nil when the bucket holds none) and every control
// at once. An active ruleset that is corrupt or refused is replaced by the
// newest good one of the bucket's history, so that every gateway that
// syncs runs the same one.
func (s *Syncer) resync(ctx context.Context, snap *fleetkv.Snapshot) {
	next := state{Entries: snap.Entries, rules: s.state.rules}
	for _, corrupt := range []map[string]*fleetkv.CorruptError{next.CorruptLists, next.CorruptOverrides} {
		for _, ce := range corrupt {
			s.corruptLog(ce)
		}
	}
	if r := snap.Rules; r != nil {
		e, rs := s.decodeRules(*r)
		next.corruptRules = r.Corrupt != nil
		if rs == nil {
			e, rs = s.newestGoodRules(ctx, snap, r.Revision)
		}
		if rs != nil {
			// Applied even when it is the ruleset in force (same pointer):
			// the rules now come from NATS, whatever the gateway started
			// from.
			next.rules, s.applied = e, rs
			s.cfg.Apply(rs)
		}
	}
	s.state = next
	s.cfg.Controls.Replace(next.ControlSet())
	s.countCorrupt()
	s.resynced()
	s.noteLadderAll()
	if !s.syncedFlag.Swap(true) {
		close(s.synced)
	}
	s.log.Info("control plane read", slog.Int64("rules_version", rulesVersion(s.state.rules)),
		slog.Int("list_entries", len(next.Lists)), slog.Int("overrides", len(next.Overrides)),
		slog.Int("corrupt_entries", len(next.CorruptLists)+len(next.CorruptOverrides)))
}

// newestGoodRules returns the newest ruleset of the rules bucket's history
// below revision below that decodes and passes (the same pointer as the
// one in force when it is that one), or nil ones when there is none or the
// history cannot be read (logged).
func (s *Syncer) newestGoodRules(ctx context.Context, snap *fleetkv.Snapshot, below uint64) (*tollgatev1.RulesEntry, *rulefile.Ruleset) {
	hctx, cancel := context.WithTimeout(ctx, historyTimeout)
	defer cancel()
	hist, err := snap.RulesVersions(hctx)
	if err != nil {
		s.log.Warn("the active ruleset is refused and the rules history unreadable; the rules in force stay",
			slog.String("error", err.Error()))
		return nil, nil
	}
	for i := len(hist) - 1; i >= 0; i-- {
		h := hist[i]
		if h.Revision >= below || h.Entry == nil {
			continue
		}
		if rs, err := s.checkRules(h.Entry); err == nil {
			if rs == s.applied {
				return s.state.rules, rs
			}
			s.log.Warn("the active ruleset is refused; putting in force the newest good version of the rules history, as every gateway does",
				slog.Int64("version", h.Entry.Version), slog.Uint64("revision", h.Revision))
			return h.Entry, rs
		}
	}
	return nil, nil
}

// changed records an applied change: the time, and that the
// last-known-good copy is behind. The copy is encoded and handed to the
// saver at the first tick (every second) that saveDue allows, or when Run
// returns — never on the change's
// own path: a burst of changes costs one encoding and one write, and the
// gateways of a fleet, which all receive a change at the same instant,
// do not all encode and write their copies at that instant while the
// next change is arriving (each writes at its own tick).
func (s *Syncer) changed() {
	now := time.Now()
	s.lastApplied.Store(now.UnixNano())
	if !s.dirty {
		s.dirty, s.since = true, now
	}
}

// resynced is changed for a whole (re)read of the buckets: the copy is
// handed to the saver at once when the last one was handed SaveInterval
// ago or more, so that a gateway that starts or reconnects has its copy
// on disk without waiting for a tick.
func (s *Syncer) resynced() {
	s.changed()
	if time.Since(s.handed) >= s.cfg.SaveInterval {
		s.handOff()
	}
}

// handOff encodes the copy and hands it to the saver, which writes the
// newest: one it has not started on is replaced (only Run's goroutine
// sends).
func (s *Syncer) handOff() {
	s.dirty, s.handed = false, time.Now()
	b, err := s.encode()
	if err != nil {
		s.log.Error("last-known-good copy not written", slog.String("error", err.Error()))
		return
	}
	select {
	case <-s.toSave:
	default:
	}
	s.toSave <- b
}

// maxSaveDelay, in SaveIntervals, bounds how long changes that keep
// coming hold the copy back.
const maxSaveDelay = 10

// saveDue hands off the copy when it is behind, the interval since the
// last one is over, and the changes have paused for an interval — or
// have kept coming for maxSaveDelay intervals. A stream of changes (a
// script's, the penalty ladder's, an operator's) then costs one copy at
// its end, or one per maxSaveDelay intervals, not one a second on every
// gateway: 200 gateways wrote and fsynced 200 copies a second while
// changes kept arriving, a fifth of the CPU that reached them.
func (s *Syncer) saveDue(now time.Time) {
	if !s.dirty || now.Sub(s.handed) < s.cfg.SaveInterval {
		return
	}
	quiet := now.Sub(time.Unix(0, s.lastApplied.Load())) >= s.cfg.SaveInterval
	if quiet || now.Sub(s.since) >= maxSaveDelay*s.cfg.SaveInterval {
		s.handOff()
	}
}

// saver writes the copies handOff hands it until toSave is closed, so
// that a change is in force before the disk has it and a slow fsync never
// delays the next change.
func (s *Syncer) saver() {
	failing := ""
	for b := range s.toSave {
		if err := writeAtomic(s.cfg.Dir, LKGFile, b); err != nil {
			if msg := err.Error(); msg != failing {
				failing = msg
				s.log.Error("last-known-good copy not written; the gateway would restart from an older one", slog.String("error", msg))
			}
			continue
		}
		failing = ""
	}
}

func rulesVersion(e *tollgatev1.RulesEntry) int64 {
	if e == nil {
		return 0
	}
	return e.Version
}

// change applies a change of one key of the buckets.
func (s *Syncer) change(c fleetkv.Change) {
	if c.Bucket == tollgatev1.BucketRules {
		s.changeRules(c)
		return
	}
	before := s.ladderKeyID(c.Bucket, c.Key)
	if c.Corrupt != nil {
		s.corruptLog(c.Corrupt)
	}
	s.edits = append(s.edits, s.state.Apply(c))
	for _, keyID := range []string{before, s.ladderKeyID(c.Bucket, c.Key)} {
		if keyID != "" {
			s.noteLadder(keyID)
		}
	}
}

// flush publishes the controls' changes of a burst (fleetkv.Handler's
// Flush) with one Controls.Edit: one publication for the burst, without
// a copy of the lists.
func (s *Syncer) flush() {
	if len(s.edits) == 0 {
		return
	}
	edits := s.edits
	s.cfg.Controls.Edit(func(w guard.ControlWriter) {
		for _, edit := range edits {
			edit(w)
		}
	})
	clear(s.edits)
	s.edits = s.edits[:0]
	s.countCorrupt()
	s.changed()
}

// changeRules applies a change of the rules bucket's active key. A corrupt
// or refused ruleset leaves the running one in force.
func (s *Syncer) changeRules(c fleetkv.Change) {
	if c.Deleted {
		s.log.Warn("the ruleset was deleted from NATS; the rules in force stay", slog.Uint64("revision", c.Revision))
		return
	}
	e, rs := s.decodeRules(c)
	s.state.corruptRules = c.Corrupt != nil
	s.countCorrupt()
	if rs == nil {
		return
	}
	s.state.rules, s.applied = e, rs
	s.cfg.Apply(rs)
	s.changed()
}

// decodeRules checks a ruleset entry. It returns a nil ruleset for one
// corrupt or refused (logged and reported once) or already in force (then
// the one in force is returned: same pointer).
func (s *Syncer) decodeRules(c fleetkv.Change) (*tollgatev1.RulesEntry, *rulefile.Ruleset) {
	if c.Corrupt != nil {
		s.refuse(fmt.Sprintf("revision %d", c.Revision), 0, c.Corrupt.Err, slog.Uint64("revision", c.Revision),
			slog.String("repair", fmt.Sprintf("PUT /admin/v1/rules with If-Match: r%d, or POST /admin/v1/rules/rollback", c.Revision)))
		return nil, nil
	}
	e := c.Rules
	if cur := s.state.rules; cur != nil && s.applied != nil && cur.Version == e.Version && cur.Source == e.Source {
		return cur, s.applied
	}
	rs, err := s.checkRules(e)
	if err != nil {
		s.refuse(fmt.Sprintf("%d/%s", e.Version, e.Source), e.Version, err, slog.String("actor", e.Actor))
		return e, nil
	}
	for _, w := range rs.Rules.Warnings() {
		s.log.Warn("ruleset from NATS put in force with allow_total_block: it refuses every request",
			slog.Int64("version", e.Version), slog.String("rule", w.Rule), slog.String("field", w.Field), slog.Int("line", w.Line),
			slog.String("problem", w.Msg))
	}
	return e, rs
}

// checkRules parses and checks a ruleset entry's source; the ruleset in
// force is returned as is (same pointer). An entry's Document, decoded, is
// used when it compiles and passes without a warning; otherwise the source
// is parsed, so that what is refused or warned about is reported with its
// lines.
func (s *Syncer) checkRules(e *tollgatev1.RulesEntry) (*rulefile.Ruleset, error) {
	if cur := s.state.rules; cur != nil && s.applied != nil && cur.Version == e.Version && cur.Source == e.Source {
		return s.applied, nil
	}
	if len(e.Document) > 0 {
		rs, err := rulefile.FromDocument(e.Document, []byte(e.Source), e.Version)
		if err == nil && s.cfg.Check != nil {
			err = s.cfg.Check(rs.Rules)
		}
		if err == nil && len(rs.Rules.Warnings()) == 0 {
			return rs, nil
		}
	}
	rs, err := rulefile.ParseVersion([]byte(e.Source), e.Version)
	if err == nil && s.cfg.Check != nil {
		err = s.cfg.Check(rs.Rules)
	}
	return rs, err
}

// refuse logs and reports a refused ruleset, once per distinct one (id).
func (s *Syncer) refuse(id string, version int64, err error, attrs ...any) {
	if id == s.refused {
		return
	}
	s.refused = id
	attrs = append(attrs, slog.Int64("version", version), slog.Int64("version_in_force", rulesVersion(s.state.rules)))
	s.log.Error("ruleset from NATS refused; the running rules stay", append(attrs, rulefile.Problems(err)...)...)
	s.cfg.OnRefused(err)
}

// corruptLog logs a corrupt blocklist or overrides entry, once per KV key
// and revision (a resync reads it again), saying what the gateway does
// with it and which operator API call repairs it.
func (s *Syncer) corruptLog(ce *fleetkv.CorruptError) {
	id := fmt.Sprintf("%s/%s/%d", ce.Bucket, ce.Key, ce.Revision)
	if s.corruptLogged[id] {
		return
	}
	if s.corruptLogged == nil || len(s.corruptLogged) > 10_000 {
		s.corruptLogged = map[string]bool{}
	}
	s.corruptLogged[id] = true
	effect, repair := "ignored: the rules' own limits apply", "DELETE or PUT /admin/v1/overrides/{key}"
	if ce.Bucket == tollgatev1.BucketBlocklist {
		switch keyID, blocks := fleetkv.CorruptBlock(ce.Key); {
		case blocks:
			effect, repair = "the key_id is blocked (403) until it is replaced or deleted", "DELETE /admin/v1/blocklist/kid:"+keyID
		case strings.HasPrefix(ce.Key, "allow."):
			effect, repair = "the key is not allowlisted", "DELETE /admin/v1/allowlist/kid:"+keyID
		default:
			effect, repair = "no key_id: it matches no request", "delete the KV key"
		}
	}
	s.log.Warn("corrupt entry in NATS; every gateway treats it the same way", slog.String("bucket", ce.Bucket),
		slog.String("kv_key", ce.Key), slog.Uint64("revision", ce.Revision), slog.String("error", ce.Err.Error()),
		slog.String("effect", effect), slog.String("repair", repair))
}
