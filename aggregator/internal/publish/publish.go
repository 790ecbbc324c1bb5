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
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
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
	// ErrCorrupt: an entry is present but does not decode, or sits under a
	// KV key its content does not belong to (written to NATS by hand, or
	// damaged); errors.As finds the *CorruptError with its revision.
	ErrCorrupt = errors.New("publish: corrupt entry")
	// ErrUnknownOutcome: a write failed in a way that leaves open whether
	// NATS applied it, and reading the entry back failed too.
	ErrUnknownOutcome = errors.New("publish: outcome of the write unknown")
	// ErrTooLarge: a value larger than NATS accepts (KV.MaxValue).
	ErrTooLarge = errors.New("publish: value too large")
)

// CorruptError is an entry that is present but does not decode, or does
// not belong under its KV key. Reads return it (with the entry's revision
// beside it, so that a conditional write can replace or delete it).
type CorruptError struct {
	Bucket   string
	Key      string
	Revision uint64
	// Bytes and SHA256 (hex) identify the stored value; its content is
	// not kept (it may be anything).
	Bytes  int
	SHA256 string
	Err    error // why it is corrupt
}

func (e *CorruptError) Error() string {
	return fmt.Sprintf("publish: %s entry %q (revision %d, %d bytes) is corrupt: %v", e.Bucket, e.Key, e.Revision, e.Bytes, e.Err)
}

// Unwrap makes errors.Is(err, ErrCorrupt) true, and reaches the cause.
func (e *CorruptError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }

func corrupt(bucket, key string, rev uint64, value []byte, err error) *CorruptError {
	sum := sha256.Sum256(value)
	return &CorruptError{Bucket: bucket, Key: key, Revision: rev, Bytes: len(value), SHA256: hex.EncodeToString(sum[:]), Err: err}
}

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

// valueHeadroom is what a KV put's subject and headers may take of the
// server's maximum payload.
const valueHeadroom = 4 << 10

// MaxValue is the largest value a put accepts: the server's maximum
// payload (max_payload, 1 MiB by default) less room for the subject and
// headers. Larger values are refused with ErrTooLarge before anything is
// sent.
func (k *KV) MaxValue() int {
	if k.nc == nil {
		return 1<<20 - valueHeadroom
	}
	return int(k.nc.MaxPayload()) - valueHeadroom
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

// verifyTimeout bounds reading an entry back after a write whose answer
// was lost.
const verifyTimeout = 2 * time.Second

// put writes key if its revision is still rev (0: it must not exist) and
// returns the new revision. A lost race is ErrConflict. A write that
// failed otherwise (a timeout, a dropped connection) may still have been
// applied, so the entry is read back: holding exactly value at a newer
// revision, the write counts as done; unchanged, the error stands; when
// the read fails too, ErrUnknownOutcome.
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
	if err == nil {
		return n, nil
	}
	vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), verifyTimeout)
	defer cancel()
	e, gerr := kv.Get(vctx, key)
	switch {
	case gerr == nil && e.Revision() > rev && bytes.Equal(e.Value(), value):
		return e.Revision(), nil
	case gerr == nil && e.Revision() != rev:
		return 0, ErrConflict
	case errors.Is(gerr, jetstream.ErrKeyNotFound) && rev != 0:
		return 0, ErrConflict // deleted meanwhile
	case gerr == nil, errors.Is(gerr, jetstream.ErrKeyNotFound):
		return 0, fmt.Errorf("publish: write %s: %w", key, err)
	}
	return 0, fmt.Errorf("publish: write %s: %w (%w: reading it back: %v)", key, err, ErrUnknownOutcome, gerr)
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// ActiveRules returns the active ruleset entry and its KV revision (nil, 0
// when none was ever written). An entry that does not decode is a
// *CorruptError, returned with its revision.
func (k *KV) ActiveRules(ctx context.Context) (*tollgatev1.RulesEntry, uint64, error) {
	b, rev, err := get(ctx, k.Rules, tollgatev1.RulesKey)
	if err != nil || b == nil {
		return nil, 0, err
	}
	e, err := tollgatev1.DecodeRulesEntry(b)
	if err != nil {
		return nil, rev, corrupt(tollgatev1.BucketRules, tollgatev1.RulesKey, rev, b, err)
	}
	return e, rev, nil
}

// PutRules writes e as the active ruleset if the entry's revision is still
// rev.
func (k *KV) PutRules(ctx context.Context, e *tollgatev1.RulesEntry, rev uint64) (uint64, error) {
	b, err := k.encode(e)
	if err != nil {
		return 0, err
	}
	return put(ctx, k.Rules, tollgatev1.RulesKey, b, rev)
}

// EncodedSize is the size of e as a KV value, to compare with MaxValue.
func EncodedSize(e any) (int, error) {
	b, err := json.Marshal(e)
	return len(b), err
}

// encode renders a value, refusing one above MaxValue.
func (k *KV) encode(e any) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("publish: encode: %w", err)
	}
	if max := k.MaxValue(); len(b) > max {
		return nil, fmt.Errorf("%w: %d bytes encoded, NATS takes at most %d", ErrTooLarge, len(b), max)
	}
	return b, nil
}

// RulesVersion is one ruleset in the rules bucket's history: Entry, or
// Corrupt when the value does not decode.
type RulesVersion struct {
	Revision uint64
	Entry    *tollgatev1.RulesEntry
	Corrupt  *CorruptError
}

// RulesVersions returns the rulesets the bucket's history holds, oldest
// first, corrupt ones included (Corrupt set).
func (k *KV) RulesVersions(ctx context.Context) ([]RulesVersion, error) {
	hist, err := k.Rules.History(ctx, tollgatev1.RulesKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("publish: rules history: %w", err)
	}
	var out []RulesVersion
	for _, h := range hist {
		if h.Operation() != jetstream.KeyValuePut {
			continue
		}
		v := RulesVersion{Revision: h.Revision()}
		if e, err := tollgatev1.DecodeRulesEntry(h.Value()); err == nil {
			v.Entry = e
		} else {
			v.Corrupt = corrupt(tollgatev1.BucketRules, tollgatev1.RulesKey, h.Revision(), h.Value(), err)
		}
		out = append(out, v)
	}
	return out, nil
}

// List returns a blocklist bucket entry and its revision (nil, 0 when
// absent). An entry that does not decode, or does not belong under key,
// is a *CorruptError, returned with its revision.
func (k *KV) List(ctx context.Context, key string) (*tollgatev1.ListEntry, uint64, error) {
	b, rev, err := get(ctx, k.Lists, key)
	if err != nil || b == nil {
		return nil, 0, err
	}
	e, err := tollgatev1.DecodeListEntry(b)
	if err == nil {
		err = tollgatev1.CheckListKey(key, e)
	}
	if err != nil {
		return nil, rev, corrupt(tollgatev1.BucketBlocklist, key, rev, b, err)
	}
	return e, rev, nil
}

// PutList writes a blocklist bucket entry under key if its revision is
// still rev.
func (k *KV) PutList(ctx context.Context, key string, e *tollgatev1.ListEntry, rev uint64) (uint64, error) {
	b, err := k.encode(e)
	if err != nil {
		return 0, err
	}
	return put(ctx, k.Lists, key, b, rev)
}

// Override returns an override entry and its revision (nil, 0 when
// absent). An entry that does not decode, or does not belong under key,
// is a *CorruptError, returned with its revision.
func (k *KV) Override(ctx context.Context, key string) (*tollgatev1.OverrideEntry, uint64, error) {
	b, rev, err := get(ctx, k.Overrides, key)
	if err != nil || b == nil {
		return nil, 0, err
	}
	e, err := tollgatev1.DecodeOverrideEntry(b)
	if err == nil {
		err = tollgatev1.CheckOverrideKey(key, e)
	}
	if err != nil {
		return nil, rev, corrupt(tollgatev1.BucketOverrides, key, rev, b, err)
	}
	return e, rev, nil
}

// PutOverride writes an override under key if its revision is still rev.
func (k *KV) PutOverride(ctx context.Context, key string, e *tollgatev1.OverrideEntry, rev uint64) (uint64, error) {
	b, err := k.encode(e)
	if err != nil {
		return 0, err
	}
	return put(ctx, k.Overrides, key, b, rev)
}

// Delete removes key from kv if its revision is still rev (0: whatever it
// is). A lost race is ErrConflict. As put does, a delete that failed
// otherwise is checked by reading the key back: gone, it counts as done;
// when the read fails too, ErrUnknownOutcome.
func Delete(ctx context.Context, kv jetstream.KeyValue, key string, rev uint64) error {
	var opts []jetstream.KVDeleteOpt
	if rev != 0 {
		opts = append(opts, jetstream.LastRevision(rev))
	}
	err := kv.Delete(ctx, key, opts...)
	if isWrongSequence(err) {
		return ErrConflict
	}
	if err == nil {
		return nil
	}
	vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), verifyTimeout)
	defer cancel()
	e, gerr := kv.Get(vctx, key)
	switch {
	case errors.Is(gerr, jetstream.ErrKeyNotFound):
		return nil
	case gerr == nil && rev != 0 && e.Revision() != rev:
		return ErrConflict
	case gerr == nil:
		return fmt.Errorf("publish: delete %s: %w", key, err)
	}
	return fmt.Errorf("publish: delete %s: %w (%w: reading it back: %v)", key, err, ErrUnknownOutcome, gerr)
}
