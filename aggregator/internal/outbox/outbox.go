// Package outbox applies the penalty ladder's committed steps to the
// fleet's NATS KV buckets: the transactional outbox of the
// aggregator's processing loop.
//
// Writes to NATS cannot join a Kafka transaction, so the processing loop
// never writes KV: it produces each step as a PenaltyEvent on
// tollgate.penalties.v1 in the transaction that takes it. A Reconciler — a
// consumer group (tollgate-aggregator-outbox) over that topic, with
// read_committed — sees a step only once its transaction committed, and
// commits its own offsets only after the KV writes, so a crash anywhere
// leaves neither a penalty in KV without its record nor a committed record
// never applied: at worst an event is applied again, which is harmless.
//
// Applying an event is idempotent and conditional. It computes the
// entries the event's level calls for (tollgatev1.LadderRung: an override
// key.<key_id> with the event's factor, or a blocklist entry <key_id> with
// the level's action and close flag; none when the level is 0 or its
// enforcement has already run out) and makes the
// buckets hold exactly those among the ladder's entries, each write
// conditional on the revision read. It never replaces or deletes an
// operator's entry (Level 0), never writes a penalty for a key on the KV
// allowlist, and never lets an event overwrite an entry of a higher step
// (PenaltyEvent.step), nor apply one whose key's committed state (Pebble)
// is already at a higher step: a replayed or late event cannot undo a
// newer one.
package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/plugin/kslog"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/internal/promdef"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// DefaultGroup is the reconcilers' consumer group.
const DefaultGroup = "tollgate-aggregator-outbox"

// errNoKV: NATS is not reachable yet.
var errNoKV = errors.New("outbox: NATS KV not available yet")

// States reads the committed penalty state of a key (state.DB).
type States interface {
	Penalties(keyID string) ([]state.PenaltyState, error)
}

var _ States = (*state.DB)(nil)

// Config configures a Reconciler.
type Config struct {
	Brokers []string
	// Topic is the penalties topic.
	Topic string
	// Group is the consumer group (default DefaultGroup).
	Group string
	// SessionTimeout of the group (default 10s).
	SessionTimeout time.Duration
	// KV returns the buckets; nil while NATS is unreachable (the
	// reconciler waits).
	KV func() *fleetkv.KV
	// States is the materialized state, for the stale check (may be nil).
	States States
	Log    *slog.Logger
	// Now is the wall clock (default time.Now).
	Now func() time.Time
	// KafkaLog is the logger franz-go gets (default: Log).
	KafkaLog *slog.Logger
}

// Reconciler applies penalty events to KV. Create it with New and call Run
// once.
type Reconciler struct {
	cfg Config
	m   *metrics
}

// New returns a reconciler registering its metrics with reg (may be nil).
func New(cfg Config, reg prometheus.Registerer) *Reconciler {
	configs.Default(&cfg.Group, DefaultGroup)
	configs.DefaultPositive(&cfg.SessionTimeout, 10*time.Second)
	configs.Default(&cfg.Log, slog.New(slog.DiscardHandler))
	configs.Default(&cfg.KafkaLog, cfg.Log)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Reconciler{cfg: cfg, m: newMetrics(reg)}
}

// Run consumes the penalties topic and applies each event until ctx is
// done (it returns nil then). The topic must exist. It runs in the
// caller's goroutine and starts none of its own beyond the Kafka client's.
func (r *Reconciler) Run(ctx context.Context) error {
	cl, err := kgo.NewClient(
		kgo.SeedBrokers(r.cfg.Brokers...),
		kgo.WithLogger(kslog.New(r.cfg.KafkaLog)),
		kgo.ConsumerGroup(r.cfg.Group),
		kgo.ConsumeTopics(r.cfg.Topic),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.SessionTimeout(r.cfg.SessionTimeout),
		kgo.HeartbeatInterval(min(3*time.Second, r.cfg.SessionTimeout/4)),
		kgo.MetadataMinAge(250*time.Millisecond),
	)
	if err != nil {
		return fmt.Errorf("outbox: kafka client: %w", err)
	}
	defer cl.Close()
	for {
		fs := cl.PollRecords(ctx, 500)
		if ctx.Err() != nil {
			cl.AllowRebalance()
			return nil
		}
		fs.EachError(func(_ string, p int32, err error) {
			r.cfg.Log.Warn("penalties fetch failed", slog.Int("partition", int(p)), slog.String("error", err.Error()))
		})
		var stop bool
		fs.EachRecord(func(rec *kgo.Record) {
			if stop {
				return
			}
			var ev tollgatev1.PenaltyEvent
			if err := proto.Unmarshal(rec.Value, &ev); err != nil || ev.KeyId == "" {
				r.m.events.WithLabelValues("malformed").Inc()
				return
			}
			if err := r.applyRetrying(ctx, &ev); err != nil {
				stop = true // ctx done: the offsets stay where they are
			}
		})
		if stop {
			cl.AllowRebalance()
			return nil
		}
		if err := cl.CommitUncommittedOffsets(ctx); err != nil && ctx.Err() == nil {
			// Applied but not committed: the events come again, and
			// applying them again changes nothing.
			r.cfg.Log.Warn("penalties offsets not committed", slog.String("error", err.Error()))
		}
		cl.AllowRebalance()
	}
}

// applyRetrying applies ev until it succeeds; it fails only when ctx is
// done.
func (r *Reconciler) applyRetrying(ctx context.Context, ev *tollgatev1.PenaltyEvent) error {
	wait := 100 * time.Millisecond
	for {
		res, err := r.Apply(ctx, ev)
		if err == nil {
			r.m.events.WithLabelValues(res).Inc()
			if res == ResultApplied {
				r.cfg.Log.Info("penalty applied to KV", slog.String("key_id", ev.KeyId), slog.Int("level", int(ev.Level)),
					slog.String("action", ev.Action), slog.Uint64("step", ev.Step))
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		r.m.errors.Inc()
		if !errors.Is(err, errNoKV) {
			r.cfg.Log.Warn("penalty not applied to KV yet; retrying", slog.String("key_id", ev.KeyId), slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 2*time.Second)
	}
}

// Results of Apply.
const (
	ResultApplied     = "applied"     // KV changed
	ResultUnchanged   = "unchanged"   // KV already held what the event calls for
	ResultStale       = "stale"       // a newer step is committed or in KV: nothing done
	ResultOperator    = "operator"    // an operator's entry holds the key: left alone
	ResultAllowlisted = "allowlisted" // the key is allowlisted: no penalty written
)

// Apply makes KV hold what ev calls for (see the package comment) and
// returns what it did. Errors are NATS's.
func (r *Reconciler) Apply(ctx context.Context, ev *tollgatev1.PenaltyEvent) (string, error) {
	var kv *fleetkv.KV
	if r.cfg.KV != nil {
		kv = r.cfg.KV()
	}
	if kv == nil {
		return "", errNoKV
	}
	if r.cfg.States != nil {
		states, err := r.cfg.States.Penalties(ev.KeyId)
		if err != nil {
			return "", err
		}
		for _, s := range states {
			if s.Tenant == ev.Tenant && s.Step > ev.Step {
				return ResultStale, nil
			}
		}
	}
	now := r.cfg.Now()
	octx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	for attempt := 0; ; attempt++ {
		res, err := r.apply(octx, kv, ev, now)
		if !errors.Is(err, fleetkv.ErrConflict) || attempt == 4 {
			return res, err
		}
		// Someone wrote the entry meanwhile: read it again.
	}
}

func (r *Reconciler) apply(ctx context.Context, kv *fleetkv.KV, ev *tollgatev1.PenaltyEvent, now time.Time) (string, error) {
	id := ev.KeyId
	listKey, ovKey := tollgatev1.BlocklistKey(id), tollgatev1.OverrideKey(tollgatev1.ScopeKey, id)
	list, lrev, err := kv.List(ctx, listKey)
	if err != nil && lrev == 0 {
		return "", err
	}
	ov, orev, err := kv.Override(ctx, ovKey)
	if err != nil && orev == 0 {
		return "", err
	}
	// An entry that does not decode (err with a revision) is treated as an
	// operator's: left alone.
	listLadder, listOther := list != nil && list.Level > 0, lrev != 0 && (list == nil || list.Level == 0)
	ovLadder, ovOther := ov != nil && ov.Level > 0, orev != 0 && (ov == nil || ov.Level == 0)
	if (listLadder && list.Step > ev.Step) || (ovLadder && ov.Step > ev.Step) {
		return ResultStale, nil
	}
	level := int(ev.Level)
	rung := tollgatev1.LadderRung(level)
	expires := time.UnixMicro(ev.ExpiresAtUnixMicros)
	live := rung.Level > tollgatev1.LevelNone && ev.ExpiresAtUnixMicros > 0 && expires.After(now)
	wantList, wantOv := live && rung.List != "", live && rung.Override
	result := ResultUnchanged
	if wantList || wantOv {
		allow, arev, err := kv.List(ctx, tollgatev1.AllowlistKey(id))
		if err != nil && arev == 0 {
			return "", err
		}
		if allow != nil && tollgatev1.Live(allow.ExpiresAt, now) {
			wantList, wantOv, result = false, false, ResultAllowlisted
		}
	}
	created := time.UnixMicro(ev.StartsAtUnixMicros).UTC()
	changed, operator := false, false
	deleteList, deleteOv := false, false
	switch {
	case wantList && listOther:
		operator = true
	case wantList:
		e := &tollgatev1.ListEntry{KeyID: id, KeyPrefix: ev.KeyPrefix, Action: rung.List, Close: rung.Close, Level: level, Step: ev.Step,
			Reason: ev.Reason, Actor: "penalty-ladder:" + ev.IssuedBy, CreatedAt: created, ExpiresAt: expires.UTC()}
		if !listLadder || list.Step != ev.Step {
			if _, err := kv.PutList(ctx, listKey, e, lrev); err != nil {
				return "", err
			}
			changed = true
		}
	case listLadder:
		deleteList = true
	}
	switch {
	case wantOv && ovOther:
		operator = true
	case wantOv:
		e := &tollgatev1.OverrideEntry{Scope: tollgatev1.ScopeKey, Subject: id, KeyPrefix: ev.KeyPrefix, Factor: ev.Factor,
			Level: level, Step: ev.Step, Reason: ev.Reason, Actor: "penalty-ladder:" + ev.IssuedBy, CreatedAt: created,
			ExpiresAt: expires.UTC()}
		if !ovLadder || ov.Step != ev.Step {
			if _, err := kv.PutOverride(ctx, ovKey, e, orev); err != nil {
				return "", err
			}
			changed = true
		}
	case ovLadder:
		deleteOv = true
	}
	// Deletes after the writes, so that a move between levels (2 → 1: the
	// penalty goes, the override comes) never leaves a moment in which
	// gateways enforce neither.
	if deleteList {
		if err := fleetkv.Delete(ctx, kv.Lists, listKey, lrev); err != nil {
			return "", err
		}
		changed = true
	}
	if deleteOv {
		if err := fleetkv.Delete(ctx, kv.Overrides, ovKey, orev); err != nil {
			return "", err
		}
		changed = true
	}
	switch {
	case operator:
		r.cfg.Log.Warn("penalty not written: an operator's entry holds the key (the ladder never replaces one)",
			slog.String("key_id", id), slog.Int("level", level))
		return ResultOperator, nil
	case result == ResultAllowlisted:
		return result, nil
	case changed:
		return ResultApplied, nil
	}
	return ResultUnchanged, nil
}

type metrics struct {
	events *prometheus.CounterVec
	errors prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: promdef.CounterVec("tollgate_aggregator_outbox_events_total", "Penalty events the KV reconciler handled, by result: applied (KV changed), unchanged (KV held it already: a replay), stale (a newer step exists), operator (an operator's entry holds the key), allowlisted, malformed.", "result"),
		errors: promdef.Counter("tollgate_aggregator_outbox_errors_total", "Failed attempts to apply a penalty event to NATS KV (retried until they succeed)."),
	}
	for _, r := range []string{ResultApplied, ResultUnchanged, ResultStale, ResultOperator, ResultAllowlisted, "malformed"} {
		m.events.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.events, m.errors)
	}
	return m
}
