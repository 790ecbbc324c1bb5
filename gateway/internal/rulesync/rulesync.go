// Package rulesync keeps a gateway's rules and controls in step with the
// fleet's control plane (fleet mode): it watches the NATS
// JetStream KV buckets the aggregator's operator API writes —
// tollgate_rules (key active: the ruleset), tollgate_blocklist (blocked,
// penalised and allowlisted keys) and tollgate_overrides — and applies
// every change at once: a ruleset is swapped whole, a control change is one
// guard.Controls update. After every applied change it writes a
// last-known-good copy to disk (lkg.json, written to a temporary file,
// fsynced and renamed), from which a gateway starts when NATS is
// unreachable. The copy is written after the change is in force, by a
// goroutine of its own, so a slow disk never delays the next change; of a
// burst of changes, the newest state is written.
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
// A blocklist entry maps to guard.Controls by its action: block → Block
// (403 KEY_BLOCKED), penalty → a guard.Penalty (429 PENALTY, Retry-After
// the time left), allow → Allow. The ladder's level travels with its
// entries (the reduced limit's override too), and close, the
// connection-level answer, is honoured only at a level that calls for it
// (tollgatev1.LadderRung). An override maps to a key
// override (key.<key_id>) or a tenant override (tenant.<base64url>): limit
// is absolute, factor multiplicative (rules.Override). Entries are named by
// key_id, so decisions on blocked keys need no Redis round trip.
//
// # Corrupt entries
//
// An entry that does not decode, or whose KV key does not match its
// content (written to NATS by hand, or damaged), is corrupt. Every gateway
// treats one the same way, from the bucket's content alone — never from
// its own history, which differs between a gateway that ran through the
// change, one that restarts from its last-known-good copy and a new one —
// so that corruption never splits the fleet:
//
//   - In tollgate_blocklist, a corrupt entry under a key_id's KV key blocks
//     that key_id (403 KEY_BLOCKED) until it is replaced or deleted: the
//     entries there are blocks and penalties, so the one that is unreadable
//     most likely restricted the key, and failing closed for that one key
//     is visible and bounded, where failing open would let a revoked or
//     abusive key back in on some gateways. A corrupt allow.<key_id> entry
//     allowlists nothing (the key is limited by the rules, as any other).
//     A KV key that is no key_id matches no request.
//   - In tollgate_overrides, a corrupt entry is no override: the rules' own
//     limits apply.
//   - A corrupt (or refused) active ruleset leaves the running ruleset in
//     force; a gateway that (re)syncs meanwhile puts in force the newest
//     version in the rules bucket's history that decodes and passes — the
//     one the others run.
//
// Each is logged (once per KV key and revision) with the operator API call
// that repairs it, and counted in Status().Corrupt (the gateway's
// tollgate_nats_corrupt_entries gauge). The operator API shows such
// entries (409 RULES_CORRUPT or ENTRY_CORRUPT) and replaces or deletes
// them.
//
// # Reconnects
//
// A KV watcher kept across a NATS outage goes blind for 10–20 s after the
// server returns (see compose/natsserver). So on every (re)connect the
// Syncer drops its watchers, watches every key of the three buckets
// afresh, computes the whole state from what they deliver and puts it in
// force with one Controls.Replace: a key deleted while the gateway was
// disconnected is gone after the resync. While NATS is unreachable the
// gateway keeps what it has. Until the buckets exist (the aggregator
// creates them) it retries every few seconds, logging the problem once.
//
// # Goroutines
//
// Run owns the NATS connection; nats.go runs its reader, flusher and
// callback dispatcher goroutines for it, and Run closes the connection
// before it returns. Stopping a session's watchers can take seconds right
// after a server restart, so it runs on a goroutine of its own, which Run
// waits for before it returns; so does the saver, which writes the
// last-known-good copy and finishes the last one before Run returns.
// Everything else happens on Run's goroutine, which owns the Syncer's
// state: it needs no lock.
package rulesync

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/gateway/internal/rulefile"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Errors.
var (
	// ErrConfig is wrapped by New's errors for an unusable Config.
	ErrConfig = errors.New("rulesync: invalid configuration")

	// errResync ends a session so that the next one reads everything
	// afresh: the connection came back.
	errResync = errors.New("rulesync: reconnected")
)

// Timings.
const (
	// DefaultReconnectWait is Config.ReconnectWait's default.
	DefaultReconnectWait = 250 * time.Millisecond
	// opTimeout bounds one JetStream request (opening a bucket, creating a
	// watcher): a lost request costs this much before the retry.
	opTimeout = time.Second
	// initialTimeout bounds the delivery of the buckets' current content
	// at the start of a session.
	initialTimeout = 10 * time.Second
	// maxRetryWait is the longest pause between two failed sessions.
	maxRetryWait = 2 * time.Second
	// stopTimeout bounds the wait for a stopped watcher's delivery to end.
	stopTimeout = 2 * time.Second
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
}

// Syncer watches the control plane's buckets. Create it with New, call
// LoadLKG (optional) and then Run once.
type Syncer struct {
	cfg Config
	log *slog.Logger

	synced   chan struct{} // closed after the first complete read
	nc       atomic.Pointer[nats.Conn]
	retiring sync.WaitGroup // stopWatchers of ended sessions; Run waits

	syncedFlag  atomic.Bool
	lastApplied atomic.Int64    // Unix ns of the last applied change; 0: none
	corrupt     [3]atomic.Int64 // corrupt entries now, by bucket (inRules, inLists, inOverrides)

	// Owned by Run's goroutine (and by LoadLKG before Run).
	state   state
	applied *rulefile.Ruleset // the ruleset of state.rules
	refused string            // identity of the last refused ruleset
	failing string            // the session problem last logged
	ladder  ladderLog         // the penalty ladder's moves last logged
	// corruptLogged: the corrupt entries logged, by bucket/key/revision.
	corruptLogged map[string]bool
	toSave        chan []byte // to the saver: the newest copy not written yet
}

// state is what the Syncer holds from the buckets, by KV key.
type state struct {
	rules     *tollgatev1.RulesEntry // the ruleset in force; nil: none from NATS
	lists     map[string]*tollgatev1.ListEntry
	overrides map[string]*tollgatev1.OverrideEntry
	// corruptLists and corruptOverrides are the corrupt entries, by KV
	// key: their revision. corruptRules: the active ruleset entry is
	// corrupt.
	corruptLists     map[string]uint64
	corruptOverrides map[string]uint64
	corruptRules     bool
}

func newState() state {
	return state{lists: map[string]*tollgatev1.ListEntry{}, overrides: map[string]*tollgatev1.OverrideEntry{},
		corruptLists: map[string]uint64{}, corruptOverrides: map[string]uint64{}}
}

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
	if cfg.ReconnectWait <= 0 {
		cfg.ReconnectWait = DefaultReconnectWait
	}
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
	s.corrupt[inLists].Store(int64(len(s.state.corruptLists)))
	s.corrupt[inOverrides].Store(int64(len(s.state.corruptOverrides)))
}

// Run connects to NATS and keeps the rules and controls in step with the
// buckets until ctx is done; then it closes the connection and returns
// nil. It does not wait for NATS: while NATS is unreachable it retries,
// and the rules and controls in force stay. Run may be called once; it
// fails only for a URL nats.go refuses.
func (s *Syncer) Run(ctx context.Context) error {
	signal := make(chan struct{}, 1) // a (re)connect since the last session started
	notify := func(*nats.Conn) {
		select {
		case signal <- struct{}{}:
		default:
		}
	}
	nc, err := nats.Connect(s.cfg.URL,
		nats.Name(s.cfg.Name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(s.cfg.ReconnectWait),
		nats.RetryOnFailedConnect(true),
		nats.ConnectHandler(func(c *nats.Conn) {
			s.log.Info("nats connected", slog.String("url", redactURL(c.ConnectedUrl())))
			notify(c)
		}),
		nats.ReconnectHandler(func(c *nats.Conn) {
			s.log.Info("nats reconnected; reading the buckets afresh", slog.String("url", redactURL(c.ConnectedUrl())))
			notify(c)
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				s.log.Warn("nats disconnected; the rules and controls in force stay until it is back", slog.String("error", err.Error()))
			}
		}),
		nats.NoCallbacksAfterClientClose())
	if err != nil {
		return fmt.Errorf("rulesync: connect %s: %w", redactURL(s.cfg.URL), err)
	}
	s.nc.Store(nc)
	// Kept by nats.go across reconnects; it ends with the connection.
	if _, err := nc.Subscribe(tollgatev1.SubjectCounters, s.countersChanged); err != nil {
		nc.Close()
		return fmt.Errorf("rulesync: subscribe %s: %w", tollgatev1.SubjectCounters, err)
	}
	var saving sync.WaitGroup
	saving.Go(s.saver)
	// In this order on return: the connection closed, which ends the
	// requests of watchers still being stopped; those waited for; the last
	// copy written.
	defer saving.Wait()
	defer close(s.toSave)
	defer s.retiring.Wait()
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("rulesync: jetstream: %w", err)
	}

	wait := s.cfg.ReconnectWait
	retry := time.NewTimer(0)
	defer retry.Stop()
	for {
		err := s.session(ctx, nc, js, signal)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errResync) {
			wait = s.cfg.ReconnectWait
			continue
		}
		if msg := err.Error(); msg != s.failing {
			s.failing = msg
			s.log.Warn("control plane unavailable; the rules and controls in force stay", slog.String("error", msg))
		}
		retry.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-signal: // connected: try at once
		case <-retry.C:
		}
		wait = min(2*wait, maxRetryWait)
	}
}

// countersChanged handles a message on tollgatev1.SubjectCounters.
func (s *Syncer) countersChanged(m *nats.Msg) {
	var c tollgatev1.CountersChanged
	if err := json.Unmarshal(m.Data, &c); err != nil {
		// Unknown counters and kind: every counter's state goes, leases
		// given back (a reset's then come off its fresh counters, the
		// bound docs/gateway.md states).
		s.log.Warn("a counter-change message that does not decode; dropping the fast path's local state of every counter",
			slog.String("error", err.Error()))
		c = tollgatev1.CountersChanged{}
	} else {
		s.log.Debug("counters changed by the operator API: dropping the fast path's local state of them",
			slog.String("kind", c.Kind), slog.String("key_id", c.KeyID), slog.Int("counters", len(c.Counters)))
	}
	if s.cfg.OnCountersChanged != nil {
		s.cfg.OnCountersChanged(c.Kind == tollgatev1.CountersReset, c.Counters)
	}
}

// buckets are one session's watchers, and the rules bucket (for its
// history).
type buckets struct {
	rules, lists, overrides jetstream.KeyWatcher
	rulesKV                 jetstream.KeyValue
}

// session reads the three buckets whole, puts their state in force, then
// applies their changes until ctx is done, the connection comes back from
// an outage (errResync) or a watcher fails.
func (s *Syncer) session(ctx context.Context, nc *nats.Conn, js jetstream.JetStream, signal chan struct{}) error {
	select {
	case <-signal: // this session reads everything: that is the resync
	default:
	}
	if !nc.IsConnected() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-signal:
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w, err := s.watch(ctx, js)
	if err != nil {
		return err
	}
	defer s.retire(w.rules, w.lists, w.overrides)

	// The current content: each watcher sends it, then nil.
	next := newState()
	var rulesEntry jetstream.KeyValueEntry
	initial := time.NewTimer(initialTimeout)
	defer initial.Stop()
	for open := 3; open > 0; {
		var e jetstream.KeyValueEntry
		var ok bool
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-signal:
			return errResync
		case <-initial.C:
			return fmt.Errorf("rulesync: the buckets' content did not arrive within %v", initialTimeout)
		case e, ok = <-w.rules.Updates():
			if ok && e != nil {
				rulesEntry = e
			}
		case e, ok = <-w.lists.Updates():
			if ok && e != nil {
				s.putList(&next, e)
			}
		case e, ok = <-w.overrides.Updates():
			if ok && e != nil {
				s.putOverride(&next, e)
			}
		}
		if !ok {
			return errors.New("rulesync: a watcher stopped while reading the buckets")
		}
		if e == nil {
			open--
		}
	}
	s.resync(ctx, next, rulesEntry, w.rulesKV)
	if s.failing != "" {
		s.failing = ""
		s.log.Info("control plane reachable again")
	}

	ends := time.NewTicker(ladderEndDelay) // the ladder's log: ends of penalties
	defer ends.Stop()
	for {
		var e jetstream.KeyValueEntry
		ok := true
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-signal:
			return errResync
		case now := <-ends.C:
			s.flushLadderEnds(now)
			continue
		case e, ok = <-w.rules.Updates():
			if ok && e != nil {
				s.changeRules(e)
			}
		case e, ok = <-w.lists.Updates():
			if ok && e != nil {
				s.changeList(e)
			}
		case e, ok = <-w.overrides.Updates():
			if ok && e != nil {
				s.changeOverride(e)
			}
		}
		if !ok {
			return errors.New("rulesync: a watcher stopped")
		}
	}
}

// watch opens the buckets and watches every key of them.
//
// Right after a NATS server restarts, a request to create a watcher's
// consumer may go unanswered, and nats.go would wait 5 s for it. The
// watcher's context is also its lifetime (cancelling it stops the
// watcher), so each creation gets a context of its own, cancelled by a
// timer if the creation takes longer than opTimeout: the session then
// fails fast and the next one retries.
func (s *Syncer) watch(ctx context.Context, js jetstream.JetStream) (*buckets, error) {
	w := &buckets{}
	for _, b := range []struct {
		name string
		dst  *jetstream.KeyWatcher
		keys string
	}{
		{tollgatev1.BucketRules, &w.rules, tollgatev1.RulesKey},
		{tollgatev1.BucketBlocklist, &w.lists, jetstream.AllKeys},
		{tollgatev1.BucketOverrides, &w.overrides, jetstream.AllKeys},
	} {
		octx, cancel := context.WithTimeout(ctx, opTimeout)
		kv, err := js.KeyValue(octx, b.name)
		cancel()
		if err == nil {
			if b.name == tollgatev1.BucketRules {
				w.rulesKV = kv
			}
			*b.dst, err = s.watchKeys(ctx, kv, b.keys)
		}
		if err != nil {
			s.retire(w.rules, w.lists, w.overrides)
			if errors.Is(err, jetstream.ErrBucketNotFound) {
				return nil, fmt.Errorf("rulesync: bucket %s does not exist yet (the aggregator creates it)", b.name)
			}
			return nil, fmt.Errorf("rulesync: watch bucket %s: %w", b.name, err)
		}
	}
	return w, nil
}

// watchKeys creates a watcher of keys that lives until ctx is done, giving
// up on its creation after opTimeout. (The timer's function, run by the
// runtime on a goroutine of its own, only cancels a context: nothing to
// wait for.)
func (s *Syncer) watchKeys(ctx context.Context, kv jetstream.KeyValue, keys string) (jetstream.KeyWatcher, error) {
	wctx, cancel := context.WithCancel(ctx)
	abort := time.AfterFunc(opTimeout, cancel)
	kw, err := kv.Watch(wctx, keys)
	if !abort.Stop() {
		// The timer fired: the creation was aborted, or ended just then
		// with a watcher already stopped by the cancel.
		if err == nil {
			s.retire(kw)
		}
		return nil, fmt.Errorf("creating the watcher took more than %v", opTimeout)
	}
	if err != nil {
		cancel()
		return nil, err
	}
	// cancel is called when ctx ends (it is wctx's parent).
	return kw, nil
}

// retire stops watchers (nil ones are skipped) on a goroutine of their
// own, which Run waits for before it returns: stopping one deletes its
// consumer, a request that may go unanswered for 5 s right after a NATS
// server restarts, and the next session must not wait for that.
func (s *Syncer) retire(kws ...jetstream.KeyWatcher) {
	s.retiring.Go(func() { stopWatchers(kws...) })
}

// stopWatchers stops watchers and then waits, at most stopTimeout in all,
// for their deliveries to end: a delivery blocked on a full Updates
// channel would otherwise hold a nats.go goroutine forever.
func stopWatchers(kws ...jetstream.KeyWatcher) {
	for _, kw := range kws {
		if kw != nil {
			_ = kw.Stop()
		}
	}
	deadline := time.NewTimer(stopTimeout)
	defer deadline.Stop()
	for _, kw := range kws {
		if kw == nil {
			continue
		}
	drain:
		for {
			select {
			case _, ok := <-kw.Updates():
				if !ok {
					break drain
				}
			case <-deadline.C:
				return
			}
		}
	}
}

// resync puts a whole state read from the buckets in force: the ruleset
// (rulesEntry, nil when the bucket holds none) and every control at once.
// An active ruleset that is corrupt or refused is replaced by the newest
// good one of the bucket's history (rulesKV), so that every gateway that
// syncs runs the same one.
func (s *Syncer) resync(ctx context.Context, next state, rulesEntry jetstream.KeyValueEntry, rulesKV jetstream.KeyValue) {
	next.rules = s.state.rules
	if rulesEntry != nil && rulesEntry.Operation() == jetstream.KeyValuePut {
		e, rs, ok := s.decodeRules(rulesEntry)
		next.corruptRules = e == nil && !ok
		if rs == nil && rulesKV != nil {
			e, rs = s.newestGoodRules(ctx, rulesKV, rulesEntry.Revision())
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
	s.cfg.Controls.Replace(buildControls(next))
	s.countCorrupt()
	s.changed()
	s.noteLadderAll()
	if !s.syncedFlag.Swap(true) {
		close(s.synced)
	}
	s.log.Info("control plane read", slog.Int64("rules_version", rulesVersion(s.state.rules)),
		slog.Int("list_entries", len(next.lists)), slog.Int("overrides", len(next.overrides)),
		slog.Int("corrupt_entries", len(next.corruptLists)+len(next.corruptOverrides)))
}

// newestGoodRules returns the newest ruleset of the rules bucket's history
// below revision below that decodes and passes (the same pointer as the
// one in force when it is that one), or nil ones when there is none or the
// history cannot be read (logged).
func (s *Syncer) newestGoodRules(ctx context.Context, kv jetstream.KeyValue, below uint64) (*tollgatev1.RulesEntry, *rulefile.Ruleset) {
	hctx, cancel := context.WithTimeout(ctx, initialTimeout)
	defer cancel()
	hist, err := kv.History(hctx, tollgatev1.RulesKey)
	if err != nil {
		s.log.Warn("the active ruleset is refused and the rules history unreadable; the rules in force stay",
			slog.String("error", err.Error()))
		return nil, nil
	}
	for i := len(hist) - 1; i >= 0; i-- {
		h := hist[i]
		if h.Revision() >= below || h.Operation() != jetstream.KeyValuePut {
			continue
		}
		e, err := tollgatev1.DecodeRulesEntry(h.Value())
		if err != nil {
			continue
		}
		if rs, err := s.checkRules(e); err == nil {
			if rs == s.applied {
				return s.state.rules, rs
			}
			s.log.Warn("the active ruleset is refused; putting in force the newest good version of the rules history, as every gateway does",
				slog.Int64("version", e.Version), slog.Uint64("revision", h.Revision()))
			return e, rs
		}
	}
	return nil, nil
}

// changed records an applied change: the time, and the last-known-good
// copy, which the saver writes.
func (s *Syncer) changed() {
	s.lastApplied.Store(time.Now().UnixNano())
	b, err := s.encode()
	if err != nil {
		s.log.Error("last-known-good copy not written", slog.String("error", err.Error()))
		return
	}
	// The saver writes the newest copy: one it has not started on is
	// replaced (only this goroutine sends).
	select {
	case <-s.toSave:
	default:
	}
	s.toSave <- b
}

// saver writes the copies changed hands it until toSave is closed, so that
// a change is in force before the disk has it and a slow fsync never
// delays the next change; a burst of changes costs one write.
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

// changeRules applies a change of the rules bucket's active key. A corrupt
// or refused ruleset leaves the running one in force.
func (s *Syncer) changeRules(kve jetstream.KeyValueEntry) {
	if kve.Operation() != jetstream.KeyValuePut {
		s.log.Warn("the ruleset was deleted from NATS; the rules in force stay", slog.Uint64("revision", kve.Revision()))
		return
	}
	e, rs, ok := s.decodeRules(kve)
	s.state.corruptRules = e == nil && !ok
	s.countCorrupt()
	if rs == nil {
		return
	}
	s.state.rules, s.applied = e, rs
	s.cfg.Apply(rs)
	s.changed()
}

// decodeRules decodes and checks a ruleset entry. It returns a nil
// ruleset for one refused (logged and reported once) or already in force
// (then the one in force is returned: same pointer); ok is false for an
// entry that does not decode (corrupt, e nil too).
func (s *Syncer) decodeRules(kve jetstream.KeyValueEntry) (e *tollgatev1.RulesEntry, rs *rulefile.Ruleset, ok bool) {
	e, err := tollgatev1.DecodeRulesEntry(kve.Value())
	if err != nil {
		s.refuse(fmt.Sprintf("revision %d", kve.Revision()), 0, err, slog.Uint64("revision", kve.Revision()),
			slog.String("repair", fmt.Sprintf("PUT /admin/v1/rules with If-Match: r%d, or POST /admin/v1/rules/rollback", kve.Revision())))
		return nil, nil, false
	}
	if cur := s.state.rules; cur != nil && s.applied != nil && cur.Version == e.Version && cur.Source == e.Source {
		return cur, s.applied, true
	}
	rs, err = s.checkRules(e)
	if err != nil {
		s.refuse(fmt.Sprintf("%d/%s", e.Version, e.Source), e.Version, err, slog.String("actor", e.Actor))
		return e, nil, true
	}
	for _, w := range rs.Rules.Warnings() {
		s.log.Warn("ruleset from NATS put in force with allow_total_block: it refuses every request",
			slog.Int64("version", e.Version), slog.String("rule", w.Rule), slog.String("field", w.Field), slog.Int("line", w.Line),
			slog.String("problem", w.Msg))
	}
	return e, rs, true
}

// checkRules parses and checks a ruleset entry's source; the ruleset in
// force is returned as is (same pointer).
func (s *Syncer) checkRules(e *tollgatev1.RulesEntry) (*rulefile.Ruleset, error) {
	if cur := s.state.rules; cur != nil && s.applied != nil && cur.Version == e.Version && cur.Source == e.Source {
		return s.applied, nil
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

// changeList applies a change of one blocklist bucket key.
func (s *Syncer) changeList(kve jetstream.KeyValueEntry) {
	key := kve.Key()
	old := s.state.lists[key]
	_, oldCorrupt := s.state.corruptLists[key]
	s.putList(&s.state, kve)
	e := s.state.lists[key]
	_, nowCorrupt := s.state.corruptLists[key]
	s.cfg.Controls.Update(func(c *guard.ControlSet) {
		if old != nil {
			removeList(c, old)
		}
		if oldCorrupt {
			removeCorruptList(c, key)
		}
		if e != nil {
			addList(c, e)
		}
		if nowCorrupt {
			addCorruptList(c, key, s.state.corruptLists[key])
		}
	})
	s.countCorrupt()
	s.changed()
	for _, x := range []*tollgatev1.ListEntry{old, e} {
		if x != nil && x.Action != tollgatev1.ActionAllow {
			s.noteLadder(x.KeyID)
		}
	}
}

// changeOverride applies a change of one overrides bucket key.
func (s *Syncer) changeOverride(kve jetstream.KeyValueEntry) {
	old := s.state.overrides[kve.Key()]
	s.putOverride(&s.state, kve)
	e := s.state.overrides[kve.Key()]
	s.cfg.Controls.Update(func(c *guard.ControlSet) {
		if old != nil {
			removeOverride(c, old)
		}
		if e != nil {
			addOverride(c, e)
		}
	})
	s.countCorrupt()
	s.changed()
	for _, x := range []*tollgatev1.OverrideEntry{old, e} {
		if x != nil && x.Scope == tollgatev1.ScopeKey {
			s.noteLadder(x.Subject)
		}
	}
}

// putList records a blocklist bucket entry (or its deletion) in st: a
// corrupt one (logged) under corruptLists.
func (s *Syncer) putList(st *state, kve jetstream.KeyValueEntry) {
	key := kve.Key()
	delete(st.lists, key)
	delete(st.corruptLists, key)
	if kve.Operation() != jetstream.KeyValuePut {
		return
	}
	e, err := tollgatev1.DecodeListEntry(kve.Value())
	if err == nil {
		err = tollgatev1.CheckListKey(key, e)
	}
	if err != nil {
		st.corruptLists[key] = kve.Revision()
		s.corruptLog(tollgatev1.BucketBlocklist, key, kve.Revision(), err)
		return
	}
	st.lists[key] = e
}

// putOverride records an overrides bucket entry (or its deletion) in st:
// a corrupt one (logged) under corruptOverrides.
func (s *Syncer) putOverride(st *state, kve jetstream.KeyValueEntry) {
	key := kve.Key()
	delete(st.overrides, key)
	delete(st.corruptOverrides, key)
	if kve.Operation() != jetstream.KeyValuePut {
		return
	}
	e, err := tollgatev1.DecodeOverrideEntry(kve.Value())
	if err == nil {
		err = tollgatev1.CheckOverrideKey(key, e)
	}
	if err != nil {
		st.corruptOverrides[key] = kve.Revision()
		s.corruptLog(tollgatev1.BucketOverrides, key, kve.Revision(), err)
		return
	}
	st.overrides[key] = e
}

// corruptLog logs a corrupt blocklist or overrides entry, once per KV key
// and revision (a resync reads it again), saying what the gateway does
// with it and which operator API call repairs it.
func (s *Syncer) corruptLog(bucket, key string, rev uint64, err error) {
	id := fmt.Sprintf("%s/%s/%d", bucket, key, rev)
	if s.corruptLogged[id] {
		return
	}
	if s.corruptLogged == nil || len(s.corruptLogged) > 10_000 {
		s.corruptLogged = map[string]bool{}
	}
	s.corruptLogged[id] = true
	effect, repair := "ignored: the rules' own limits apply", "DELETE or PUT /admin/v1/overrides/{key}"
	if bucket == tollgatev1.BucketBlocklist {
		switch id, blocks := corruptBlockID(key); {
		case blocks:
			effect, repair = "the key_id is blocked (403) until it is replaced or deleted", "DELETE /admin/v1/blocklist/kid:"+id
		case strings.HasPrefix(key, "allow."):
			effect, repair = "the key is not allowlisted", "DELETE /admin/v1/allowlist/kid:"+strings.TrimPrefix(key, "allow.")
		default:
			effect, repair = "no key_id: it matches no request", "delete the KV key"
		}
	}
	s.log.Warn("corrupt entry in NATS; every gateway treats it the same way", slog.String("bucket", bucket),
		slog.String("kv_key", key), slog.Uint64("revision", rev), slog.String("error", err.Error()),
		slog.String("effect", effect), slog.String("repair", repair))
}

// redactURL drops user information from NATS URLs for logs.
func redactURL(raw string) string {
	parts := strings.Split(raw, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			parts[i] = u.Redacted()
		}
	}
	return strings.Join(parts, ",")
}
