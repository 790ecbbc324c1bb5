package adminapi

import (
	"cmp"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/guard/apierror"
)

// Penalties reads keys' committed penalty state (state.DB).
type Penalties interface {
	Penalties(keyID string) ([]state.PenaltyState, error)
}

var _ Penalties = (*state.DB)(nil)

// Commander sends commands to the owner of a decisions partition: a lift
// is a KIND_PENALTY_LIFT record in the partition that holds the key's
// penalty state, applied there in order with the key's decisions.
type Commander interface {
	Lift(ctx context.Context, partition int32, keyID, tenant, actor, reason string, at time.Time) error
}

// liftWait bounds how long DELETE penalties/{key} waits for the lift to be
// applied before it answers 202.
const liftWait = 5 * time.Second

// PenaltyView is the answer of GET penalties/{key}.
type PenaltyView struct {
	Key       string `json:"key"` // kid:<key_id>: never the raw key
	KeyID     string `json:"key_id"`
	KeyPrefix string `json:"key_prefix,omitempty"`
	Tenant    string `json:"tenant,omitempty"`
	// Level is the ladder's level (0 = none); Action what it enforces now
	// (none once its enforcement ran out, though the level stays until the
	// key has been quiet long enough to step down).
	Level      int        `json:"level"`
	Action     string     `json:"action"`
	Factor     float64    `json:"factor,omitempty"`
	Since      *time.Time `json:"since,omitempty"`
	ExpiresAt  *time.Time `json:"expires_at"`
	LastFiring *time.Time `json:"last_detector_firing,omitempty"`
	LiftedAt   *time.Time `json:"lifted_at,omitempty"`
	Step       uint64     `json:"step"`
	Partition  *int32     `json:"partition,omitempty"`
	History    []Step     `json:"history"`
}

// Step is one ladder step in a PenaltyView's history (from the audit log).
type Step struct {
	Time      string            `json:"time"`
	Level     int               `json:"level"`
	Previous  int               `json:"previous_level"`
	Change    string            `json:"change"`
	Action    string            `json:"action"`
	ExpiresAt string            `json:"expires_at,omitempty"`
	Actor     string            `json:"actor"`
	Reason    string            `json:"reason,omitempty"`
	Evidence  []json.RawMessage `json:"evidence,omitempty"`
}

func microsTime(us int64) *time.Time {
	if us <= 0 {
		return nil
	}
	t := time.UnixMicro(us).UTC()
	return &t
}

// penaltyView builds the view of a key from its states and audit log.
func (a *api) penaltyView(id, prefix string, states []state.PenaltyState, now time.Time) (PenaltyView, error) {
	v := PenaltyView{Key: "kid:" + id, KeyID: id, KeyPrefix: prefix, Action: abuse.LevelAction(abuse.LevelNone), History: []Step{}}
	// Normally one state: the key's tenant's partition. Show the most
	// severe.
	var cur *state.PenaltyState
	for i := range states {
		s := &states[i]
		if cur == nil || s.Level > cur.Level || (s.Level == cur.Level && s.Step > cur.Step) {
			cur = s
		}
	}
	if cur != nil {
		v.Tenant, v.Level, v.Step = cur.Tenant, cur.Level, cur.Step
		if cur.KeyPrefix != "" {
			v.KeyPrefix = cur.KeyPrefix
		}
		q := cur.Partition
		v.Partition = &q
		v.Since, v.LastFiring, v.LiftedAt = microsTime(cur.Since), microsTime(cur.LastFiring), microsTime(cur.LiftedAt)
		if cur.Enforced(now.UnixMicro()) {
			v.Action, v.ExpiresAt = abuse.LevelAction(cur.Level), microsTime(cur.Until)
		}
	}
	entries, err := a.cfg.Audit.Query(audit.Query{Subject: id, Kind: audit.KindPenalty, Limit: 100})
	if err != nil {
		return v, err
	}
	for _, e := range entries {
		var before, after audit.PenaltyState
		_ = json.Unmarshal(e.Before, &before)
		_ = json.Unmarshal(e.After, &after)
		j := EntryJSON(e)
		v.History = append(v.History, Step{Time: j.Time, Level: after.Level, Previous: before.Level, Change: after.Change,
			Action: after.Action, ExpiresAt: after.ExpiresAt, Actor: e.Actor, Reason: e.Reason, Evidence: j.Evidence})
		v.KeyPrefix = cmp.Or(v.KeyPrefix, e.KeyPrefix)
	}
	return v, nil
}

func (a *api) getPenalty(w http.ResponseWriter, r *http.Request) {
	id, prefix, ok := a.key(w, r)
	if !ok {
		return
	}
	if a.cfg.Penalties == nil {
		apierror.Write(w, http.StatusServiceUnavailable, apierror.Unavailable, "penalty state is not served by this instance")
		return
	}
	states, ok := a.penaltyStates(w, id)
	if !ok {
		return
	}
	a.writePenaltyView(w, id, prefix, states)
}

// penaltyStates reads the key's penalty states; when ok is false the
// request is answered.
func (a *api) penaltyStates(w http.ResponseWriter, id string) ([]state.PenaltyState, bool) {
	states, err := a.cfg.Penalties.Penalties(id)
	if err != nil {
		apierror.Write(w, http.StatusInternalServerError, apierror.Internal, "reading the penalty state failed")
		return nil, false
	}
	return states, true
}

// writePenaltyView answers 200 with the key's penalty view.
func (a *api) writePenaltyView(w http.ResponseWriter, id, prefix string, states []state.PenaltyState) {
	v, err := a.penaltyView(id, prefix, states, time.Now())
	if err != nil {
		apierror.Write(w, http.StatusInternalServerError, apierror.Internal, "reading the audit log failed")
		return
	}
	writeJSON(w, http.StatusOK, v)
}

// deletePenalty lifts a key's penalty: a lift command into every
// partition holding the key's state; it waits for the owner to apply it
// (200 with the new state) up to liftWait, else answers 202. The owner
// writes the audit entry of the lift, with this request's actor and
// reason, in the transaction that applies it.
func (a *api) deletePenalty(w http.ResponseWriter, r *http.Request) {
	id, prefix, ok := a.key(w, r)
	if !ok {
		return
	}
	if a.cfg.Penalties == nil || a.cfg.Commands == nil {
		apierror.Write(w, http.StatusServiceUnavailable, apierror.Unavailable, "penalties cannot be lifted through this instance")
		return
	}
	reason := r.URL.Query().Get("reason")
	if len(reason) > maxReason {
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "reason: too long")
		return
	}
	states, ok := a.penaltyStates(w, id)
	if !ok {
		return
	}
	if len(states) == 0 {
		apierror.Write(w, http.StatusNotFound, apierror.NotFound, "the key has no penalty state: nothing to lift")
		return
	}
	at, err := a.lift(r.Context(), id, states, actor(r), reason)
	if err != nil {
		apierror.Write(w, http.StatusBadGateway, apierror.KafkaUnavailable, "the lift could not be sent: "+err.Error())
		return
	}
	deadline := time.Now().Add(liftWait)
	for {
		states, err = a.cfg.Penalties.Penalties(id)
		if err == nil && lifted(states, at) {
			a.writePenaltyView(w, id, prefix, states)
			return
		}
		if time.Now().After(deadline) {
			writeJSON(w, http.StatusAccepted, map[string]any{"key": "kid:" + id, "status": "pending",
				"message": "the lift was sent to the key's partition and is applied once its owner reads it"})
			return
		}
		select {
		case <-r.Context().Done():
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// lift sends a lift command at now to every partition holding a state of
// the key; it returns the lift's time.
func (a *api) lift(ctx context.Context, id string, states []state.PenaltyState, actor, reason string) (time.Time, error) {
	at := time.Now()
	for _, s := range states {
		if err := a.cfg.Commands.Lift(ctx, s.Partition, id, s.Tenant, actor, reason, at); err != nil {
			return at, err
		}
	}
	return at, nil
}

// lifted reports whether every state took a lift at or after at.
func lifted(states []state.PenaltyState, at time.Time) bool {
	for _, s := range states {
		if s.LiftedAt < at.UnixMicro() {
			return false
		}
	}
	return true
}

// liftAllowlisted lifts the penalty of a key just allowlisted: allowlisted
// keys are never penalised, and a ladder block outranks the allowlist on
// gateways. Failures are logged: the allowlist entry stands.
func (a *api) liftAllowlisted(ctx context.Context, id, actor string) {
	if a.cfg.Penalties == nil || a.cfg.Commands == nil {
		return
	}
	states, err := a.cfg.Penalties.Penalties(id)
	if err != nil {
		a.cfg.Log.Error("penalty state not read after an allowlisting", slog.String("key_id", id), slog.String("error", err.Error()))
		return
	}
	var penalised []state.PenaltyState
	for _, s := range states {
		if s.Level > abuse.LevelNone {
			penalised = append(penalised, s)
		}
	}
	if len(penalised) == 0 {
		return
	}
	if _, err := a.lift(ctx, id, penalised, actor, "the key was allowlisted: allowlisted keys are never penalised"); err != nil {
		a.cfg.Log.Error("penalty of an allowlisted key not lifted", slog.String("key_id", id), slog.String("error", err.Error()))
	}
}
