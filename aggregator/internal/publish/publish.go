// Package publish writes the fleet's configuration to NATS JetStream KV
// (docs/gateway.md, fleet mode): the ruleset (bucket tollgate_rules, key active, history kept
// for rollback), blocked, penalised and allowlisted keys
// (tollgate_blocklist) and overrides (tollgate_overrides). Gateways watch
// the buckets and apply each change atomically.
//
// Every write is conditional on the revision it replaces (KV Update, or
// Create for a new key), so two writers never overwrite each other
// unknowingly: a lost race is ErrConflict. The connection must be made
// with nats.ReconnectBufSize(-1) (see Connect): otherwise a put that timed
// out while NATS was down is still sent after the reconnect and applied
// behind the caller's back.
package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Errors.
var (
	// ErrConflict: the entry changed since the revision the write expected.
	ErrConflict = errors.New("publish: entry changed meanwhile")
	// ErrNotFound: no such entry (or version).
	ErrNotFound = errors.New("publish: not found")
)

// RulesHistory is how many ruleset versions the rules bucket keeps for
// rollback (JetStream's maximum).
const RulesHistory = 64

// Connect connects to NATS for writing: failed writes are never replayed
// after a reconnect.
func Connect(url, name string, log *slog.Logger) (*nats.Conn, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	nc, err := nats.Connect(url, nats.Name(name), nats.ReconnectBufSize(-1), nats.MaxReconnects(-1),
		nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(true),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("nats disconnected", slog.String("error", err.Error()))
			}
		}),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("nats reconnected") }))
	if err != nil {
		return nil, fmt.Errorf("publish: connect %s: %w", url, err)
	}
	return nc, nil
}

// KV is the three buckets, and the connection they were opened on.
type KV struct {
	Rules, Lists, Overrides jetstream.KeyValue
	nc                      *nats.Conn
}

// CountersChanged tells every gateway (tollgatev1.SubjectCounters) that the
// operator API changed a key's counters in Redis (kind CountersReset or
// CountersQuota; counters names them), so that they drop the local state
// derived from them.
// Core NATS, at most once: the message is queued on the connection, and
// only a closed connection is an error.
func (k *KV) CountersChanged(kind, keyID string, counters []string) error {
	if k.nc == nil {
		return errors.New("publish: no connection")
	}
	b, err := json.Marshal(tollgatev1.CountersChanged{Kind: kind, KeyID: keyID, Counters: counters, Time: time.Now().UTC()})
	if err != nil {
		return err
	}
	if err := k.nc.Publish(tollgatev1.SubjectCounters, b); err != nil {
		return fmt.Errorf("publish: %s: %w", tollgatev1.SubjectCounters, err)
	}
	return nil
}

// Open creates the buckets when missing and returns them.
func Open(ctx context.Context, nc *nats.Conn) (*KV, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("publish: jetstream: %w", err)
	}
	k := &KV{nc: nc}
	for _, b := range []struct {
		dst     *jetstream.KeyValue
		name    string
		history uint8
		desc    string
	}{
		{&k.Rules, tollgatev1.BucketRules, RulesHistory, "Tollgate ruleset (key active), history kept for rollback"},
		{&k.Lists, tollgatev1.BucketBlocklist, 1, "Tollgate blocked, penalised and allowlisted keys, by key_id"},
		{&k.Overrides, tollgatev1.BucketOverrides, 1, "Tollgate temporary overrides (key.<key_id>, tenant.<base64url>)"},
	} {
		kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.name, History: b.history, Description: b.desc})
		if err != nil {
			return nil, fmt.Errorf("publish: bucket %s: %w", b.name, err)
		}
		*b.dst = kv
	}
	return k, nil
}

// get returns a key's value and revision (0, nil when absent).
func get(ctx context.Context, kv jetstream.KeyValue, key string) ([]byte, uint64, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("publish: get %s: %w", key, err)
	}
	return e.Value(), e.Revision(), nil
}

// put writes key if its revision is still rev (0: it must not exist).
func put(ctx context.Context, kv jetstream.KeyValue, key string, value []byte, rev uint64) (uint64, error) {
	var n uint64
	var err error
	if rev == 0 {
		n, err = kv.Create(ctx, key, value)
	} else {
		n, err = kv.Update(ctx, key, value, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || isWrongSequence(err) {
		return 0, ErrConflict
	}
	if err != nil {
		return 0, fmt.Errorf("publish: write %s: %w", key, err)
	}
	return n, nil
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// ActiveRules returns the active ruleset entry and its KV revision (nil, 0
// when none was ever written).
func (k *KV) ActiveRules(ctx context.Context) (*tollgatev1.RulesEntry, uint64, error) {
	b, rev, err := get(ctx, k.Rules, tollgatev1.RulesKey)
	if err != nil || b == nil {
		return nil, 0, err
	}
	e, err := tollgatev1.DecodeRulesEntry(b)
	return e, rev, err
}

// PutRules writes e as the active ruleset if the entry's revision is still
// rev.
func (k *KV) PutRules(ctx context.Context, e *tollgatev1.RulesEntry, rev uint64) (uint64, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return 0, err
	}
	return put(ctx, k.Rules, tollgatev1.RulesKey, b, rev)
}

// RulesVersions returns the rulesets the bucket's history holds, oldest
// first.
func (k *KV) RulesVersions(ctx context.Context) ([]*tollgatev1.RulesEntry, error) {
	hist, err := k.Rules.History(ctx, tollgatev1.RulesKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("publish: rules history: %w", err)
	}
	var out []*tollgatev1.RulesEntry
	for _, h := range hist {
		if h.Operation() != jetstream.KeyValuePut {
			continue
		}
		if e, err := tollgatev1.DecodeRulesEntry(h.Value()); err == nil {
			out = append(out, e)
		}
	}
	return out, nil
}

// List returns a blocklist bucket entry and its revision (nil, 0 when
// absent).
func (k *KV) List(ctx context.Context, key string) (*tollgatev1.ListEntry, uint64, error) {
	b, rev, err := get(ctx, k.Lists, key)
	if err != nil || b == nil {
		return nil, 0, err
	}
	e, err := tollgatev1.DecodeListEntry(b)
	return e, rev, err
}

// PutList writes a blocklist bucket entry under key if its revision is
// still rev.
func (k *KV) PutList(ctx context.Context, key string, e *tollgatev1.ListEntry, rev uint64) (uint64, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return 0, err
	}
	return put(ctx, k.Lists, key, b, rev)
}

// Override returns an override entry and its revision (nil, 0 when absent).
func (k *KV) Override(ctx context.Context, key string) (*tollgatev1.OverrideEntry, uint64, error) {
	b, rev, err := get(ctx, k.Overrides, key)
	if err != nil || b == nil {
		return nil, 0, err
	}
	e, err := tollgatev1.DecodeOverrideEntry(b)
	return e, rev, err
}

// PutOverride writes an override under key if its revision is still rev.
func (k *KV) PutOverride(ctx context.Context, key string, e *tollgatev1.OverrideEntry, rev uint64) (uint64, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return 0, err
	}
	return put(ctx, k.Overrides, key, b, rev)
}

// Delete removes key from kv if its revision is still rev (0: whatever it
// is).
func Delete(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	err := kv.Delete(ctx, key, opts...)
	if isWrongSequence(err) {
		return ErrConflict
	}
	if err != nil {
		return fmt.Errorf("publish: delete %s: %w", key, err)
	}
	return nil
}
