package fleetkv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Presence timings.
const (
	// DefaultPresenceTTL is the tollgate_gateways bucket's MaxAge when it
	// is created: a gateway's entry not written again for that long
	// (the gateway was killed, or cut off from NATS) leaves the bucket by
	// itself.
	DefaultPresenceTTL = 30 * time.Second
	// DefaultHeartbeat is AnnouncerConfig.Interval's default: an entry is
	// written at least this often, well within DefaultPresenceTTL.
	DefaultHeartbeat = 5 * time.Second
	// StaleAfter is how long after its last write an entry counts as
	// stale: three heartbeats missed.
	StaleAfter = 3 * DefaultHeartbeat
	// presenceTimeout bounds one write or the final delete.
	presenceTimeout = 2 * time.Second
	// presenceLogEvery is the least time between two log lines of a
	// heartbeat that keeps failing.
	presenceLogEvery = time.Minute
)

const presenceDesc = "Tollgate gateways in fleet mode, by gateway_id, with the rules version each runs (entries expire by themselves)"

// openPresence returns the tollgate_gateways bucket, creating it with
// MaxAge ttl when it is missing. An existing bucket is used as it is, so
// that gateways and aggregators of different settings never rewrite each
// other's.
func openPresence(ctx context.Context, js jetstream.JetStream, ttl time.Duration) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, tollgatev1.BucketGateways)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: tollgatev1.BucketGateways, History: 1, TTL: ttl,
			Description: presenceDesc})
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, tollgatev1.BucketGateways)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("fleetkv: bucket %s: %w", tollgatev1.BucketGateways, err)
	}
	return kv, nil
}

// OpenPresence returns the tollgate_gateways bucket, creating it with
// MaxAge ttl (0: DefaultPresenceTTL) when it is missing.
func OpenPresence(ctx context.Context, c *Conn, ttl time.Duration) (jetstream.KeyValue, error) {
	if ttl <= 0 {
		ttl = DefaultPresenceTTL
	}
	return openPresence(ctx, c.js, ttl)
}

// AnnouncerConfig configures an Announcer.
type AnnouncerConfig struct {
	// ID is the gateway's gateway_id, the entry's KV key; required, and
	// tollgatev1.CheckGatewayID must accept it.
	ID string
	// Entry returns what the gateway runs now; the Announcer sets its
	// GatewayID and Time. Called on the Announcer's goroutine; it must not
	// block. Required.
	Entry func() tollgatev1.GatewayEntry
	// Interval is the time between two writes (default DefaultHeartbeat).
	Interval time.Duration
	// TTL is the bucket's MaxAge if the Announcer creates it (default
	// DefaultPresenceTTL); an existing bucket keeps its own.
	TTL time.Duration
	// Log receives the Announcer's lines; nil discards them.
	Log *slog.Logger
	// PokeSpread, when positive, delays the write a Poke asks for by a
	// random time below it: every gateway of a fleet puts a new ruleset in
	// force at the same instant, and their writes, all at once, would
	// compete with the change's delivery to the gateways that do not have
	// it yet. 0: at once.
	PokeSpread time.Duration
	// PokeEvery, when positive, quiets pokes that come in quick
	// succession: after three writes that pokes asked for within
	// PokeEvery, pokes are left to the next Interval's write (which
	// carries what the gateway runs then) for a random time between
	// PokeEvery and twice it. Rulesets put in force one at a time are
	// written as before; a rollout of many in a row costs each gateway
	// three writes, not one per ruleset (a gateway's start alone pokes
	// twice: the ruleset it starts with, then NATS's): the gateways,
	// which all get a ruleset at the same instant, would otherwise write
	// together again and again, and their bursts of writes delayed the
	// delivery of the next change. 0: every poke writes.
	PokeEvery time.Duration
}

// Announcer keeps a gateway's entry in tollgate_gateways: Run writes it at
// once, after every Poke and every Interval, and deletes it when it
// returns. A write that fails (NATS unreachable, the bucket gone) is
// logged at most once a minute and tried again at the next; a missing
// bucket is created.
type Announcer struct {
	cfg  AnnouncerConfig
	log  *slog.Logger
	poke chan struct{}
	// delay is how long a poke waits before its write (a random time
	// below PokeSpread).
	delay func() time.Duration
	// quiet is how long pokes are left to the heartbeat once they come
	// in quick succession (a random time from PokeEvery to twice it).
	quiet func() time.Duration
}

// NewAnnouncer returns an Announcer for cfg. It does no I/O.
func NewAnnouncer(cfg AnnouncerConfig) (*Announcer, error) {
	if err := tollgatev1.CheckGatewayID(cfg.ID); err != nil {
		return nil, fmt.Errorf("fleetkv: announcer: %w", err)
	}
	if cfg.Entry == nil {
		return nil, errors.New("fleetkv: announcer: Entry required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultHeartbeat
	}
	if cfg.TTL <= 0 {
		cfg.TTL = DefaultPresenceTTL
	}
	log := cfg.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	a := &Announcer{cfg: cfg, log: log, poke: make(chan struct{}, 1), delay: func() time.Duration { return 0 },
		quiet: func() time.Duration { return 0 }}
	if cfg.PokeSpread > 0 {
		a.delay = func() time.Duration { return rand.N(cfg.PokeSpread) }
	}
	if cfg.PokeEvery > 0 {
		a.quiet = func() time.Duration { return cfg.PokeEvery + rand.N(cfg.PokeEvery) }
	}
	return a, nil
}

// Poke asks for a write now (the rules in force changed), or within
// PokeSpread. It never blocks; pokes that arrive while one is pending are
// one. A nil Announcer ignores it.
func (a *Announcer) Poke() {
	if a == nil {
		return
	}
	select {
	case a.poke <- struct{}{}:
	default:
	}
}

// Run writes the entry on c until ctx is done, then deletes it (within a
// couple of seconds) and returns. Call it once, from a goroutine its
// caller waits for before closing c.
func (a *Announcer) Run(ctx context.Context, c *Conn) {
	h := heartbeat{a: a, c: c}
	t := time.NewTicker(a.cfg.Interval)
	defer t.Stop()
	poked := time.NewTimer(0) // a poke's delay; stopped while none is pending
	poked.Stop()
	defer poked.Stop()
	pending := false
	var quietUntil time.Time // pokes before it are left to the heartbeat
	var served [2]time.Time  // when the last two writes that served a poke were made, oldest first
	h.put(ctx)
	for {
		poke := false
		select {
		case <-ctx.Done():
			h.remove(ctx)
			return
		case <-t.C:
		case <-a.poke:
			if time.Now().Before(quietUntil) {
				continue // the next heartbeat reports it
			}
			if d := a.delay(); d > 0 {
				if !pending {
					pending = true
					poked.Reset(d)
				}
				continue
			}
			poke = true
		case <-poked.C:
			poke = true
		}
		// Any write carries what the gateway runs now: a pending poke is
		// served by it.
		if pending {
			pending = false
			poked.Stop()
		}
		h.put(ctx)
		if poke {
			now := time.Now()
			if q := a.quiet(); q > 0 && now.Sub(served[0]) < a.cfg.PokeEvery {
				quietUntil = now.Add(q)
			}
			served = [2]time.Time{served[1], now}
		}
	}
}

// heartbeat is Run's state, owned by its goroutine.
type heartbeat struct {
	a       *Announcer
	c       *Conn
	kv      jetstream.KeyValue // nil: to be opened
	failing bool
	logged  time.Time // when a failure was last logged
	written bool      // an entry was written (so there is one to delete)
}

// put writes the entry, opening the bucket first when needed.
func (h *heartbeat) put(ctx context.Context) {
	pctx, cancel := context.WithTimeout(ctx, presenceTimeout)
	defer cancel()
	err := h.write(pctx)
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	switch {
	case err == nil && h.failing:
		h.failing = false
		h.a.log.Info("presence heartbeat resumed", slog.String("bucket", tollgatev1.BucketGateways))
	case err != nil && (!h.failing || now.Sub(h.logged) >= presenceLogEvery):
		h.failing, h.logged = true, now
		h.a.log.Warn("presence heartbeat failed; the gateway serves as before and tries again",
			slog.String("bucket", tollgatev1.BucketGateways), slog.Duration("every", h.a.cfg.Interval), slog.String("error", err.Error()))
	}
}

func (h *heartbeat) write(ctx context.Context) error {
	if h.kv == nil {
		kv, err := openPresence(ctx, h.c.js, h.a.cfg.TTL)
		if err != nil {
			return err
		}
		h.kv = kv
	}
	e := h.a.cfg.Entry()
	e.GatewayID, e.Time = h.a.cfg.ID, time.Now().UTC()
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("fleetkv: encode gateway entry: %w", err)
	}
	if _, err := h.kv.Put(ctx, tollgatev1.GatewayKey(h.a.cfg.ID), b); err != nil {
		// Opened again at the next write: the bucket may be gone (a NATS
		// server that lost its store), and is then created anew.
		h.kv = nil
		return fmt.Errorf("fleetkv: write %s: %w", tollgatev1.BucketGateways, err)
	}
	h.written = true
	return nil
}

// remove deletes the entry on the way out, even though ctx is done.
func (h *heartbeat) remove(ctx context.Context) {
	if !h.written || h.kv == nil {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), presenceTimeout)
	defer cancel()
	if err := h.kv.Delete(dctx, tollgatev1.GatewayKey(h.a.cfg.ID)); err != nil {
		h.a.log.Warn("presence entry not deleted; it expires by itself",
			slog.String("bucket", tollgatev1.BucketGateways), slog.String("error", err.Error()))
	}
}

// GatewaySeen is a gateway's entry as read from tollgate_gateways.
type GatewaySeen struct {
	Entry    *tollgatev1.GatewayEntry
	Revision uint64
	// Stored is when NATS stored the entry (the server's clock): when the
	// gateway was last heard from.
	Stored time.Time
}

// Gateways returns the entries of tollgate_gateways, valid ones in seen
// and the others (they do not decode, or sit under another gateway's key)
// in corrupt. A bucket that does not exist yet holds nothing.
func (k *KV) Gateways(ctx context.Context) (seen []GatewaySeen, corrupt []*CorruptError, err error) {
	if k.Presence == nil {
		return nil, nil, nil
	}
	w, err := k.Presence.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, nil, fmt.Errorf("fleetkv: read %s: %w", tollgatev1.BucketGateways, err)
	}
	defer func() { _ = w.Stop() }()
	for {
		select {
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("fleetkv: read %s: %w", tollgatev1.BucketGateways, ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, nil, fmt.Errorf("fleetkv: read %s: the watch ended", tollgatev1.BucketGateways)
			}
			if e == nil {
				return seen, corrupt, nil // the current content is all read
			}
			if e.Operation() != jetstream.KeyValuePut {
				continue
			}
			c := Decode(tollgatev1.BucketGateways, e.Key(), e.Revision(), e.Value())
			if c.Corrupt != nil {
				corrupt = append(corrupt, c.Corrupt)
				continue
			}
			seen = append(seen, GatewaySeen{Entry: c.Gateway, Revision: e.Revision(), Stored: e.Created()})
		}
	}
}
