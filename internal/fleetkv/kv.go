package fleetkv

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// RulesHistory is how many ruleset versions the rules bucket keeps for
// rollback (JetStream's maximum).
const RulesHistory = 64

// buckets are the control plane's buckets with their settings, and the
// keys a gateway watches in each.
var buckets = []struct {
	name    string
	history uint8
	desc    string
	watch   string
}{
	{tollgatev1.BucketRules, RulesHistory, "Tollgate ruleset (key active), history kept for rollback", tollgatev1.RulesKey},
	{tollgatev1.BucketBlocklist, 1, "Tollgate blocked, penalised and allowlisted keys, by key_id", jetstream.AllKeys},
	{tollgatev1.BucketOverrides, 1, "Tollgate temporary overrides (key.<key_id>, tenant.<base64url>)", jetstream.AllKeys},
}

// KV is the three control buckets, for writing, the gateways' presence
// bucket (tollgate_gateways, for reading; nil when Bind made the KV), and
// the connection they were opened on.
type KV struct {
	Rules, Lists, Overrides jetstream.KeyValue
	Presence                jetstream.KeyValue
	c                       *Conn
}

// Open creates the buckets when missing (updating the control buckets'
// settings when they differ; the presence bucket keeps its own, see
// OpenPresence) and returns them.
func Open(ctx context.Context, c *Conn) (*KV, error) {
	k := &KV{c: c}
	dst := []*jetstream.KeyValue{&k.Rules, &k.Lists, &k.Overrides}
	for i, b := range buckets {
		kv, err := c.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: b.name, History: b.history, Description: b.desc})
		if err != nil {
			return nil, fmt.Errorf("fleetkv: bucket %s: %w", b.name, err)
		}
		*dst[i] = kv
	}
	var err error
	if k.Presence, err = OpenPresence(ctx, c, 0); err != nil {
		return nil, err
	}
	return k, nil
}

// Bind returns the buckets, which must exist (Open creates them): a
// missing one is ErrNotFound. It creates and changes nothing.
func Bind(ctx context.Context, c *Conn) (*KV, error) {
	k := &KV{c: c}
	dst := []*jetstream.KeyValue{&k.Rules, &k.Lists, &k.Overrides}
	for i, b := range buckets {
		kv, err := bind(ctx, c.js, b.name)
		if err != nil {
			return nil, err
		}
		*dst[i] = kv
	}
	return k, nil
}

// bind returns an existing bucket; a missing one is ErrNotFound.
func bind(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: bucket %s does not exist yet (the aggregator creates it)", ErrNotFound, bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("fleetkv: bucket %s: %w", bucket, err)
	}
	return kv, nil
}

// valueHeadroom is what a KV put's subject and headers may take of the
// server's maximum payload.
const valueHeadroom = 4 << 10

// MaxValue is the largest value a put accepts: the server's maximum
// payload (max_payload, 1 MiB by default) less room for the subject and
// headers. Larger values are refused with ErrTooLarge before anything is
// sent.
func (k *KV) MaxValue() int {
	if k.c == nil {
		return 1<<20 - valueHeadroom
	}
	return int(k.c.nc.MaxPayload()) - valueHeadroom
}

// CountersChanged tells every gateway (tollgatev1.SubjectCounters) that the
// operator API changed a key's counters in Redis (kind CountersReset or
// CountersQuota; counters names them), so that they drop the local state
// derived from them (Conn.OnCountersChanged). Core NATS, at most once: the
// message is queued on the connection, and only a closed connection is an
// error.
func (k *KV) CountersChanged(kind, keyID string, counters []string) error {
	if k.c == nil {
		return errors.New("fleetkv: no connection")
	}
	b, err := json.Marshal(tollgatev1.CountersChanged{Kind: kind, KeyID: keyID, Counters: counters, Time: time.Now().UTC()})
	if err != nil {
		return fmt.Errorf("fleetkv: encode counter change: %w", err)
	}
	if err := k.c.nc.Publish(tollgatev1.SubjectCounters, b); err != nil {
		return fmt.Errorf("fleetkv: %s: %w", tollgatev1.SubjectCounters, err)
	}
	return nil
}

// read returns key's entry in kv, decoded (a zero Change, but for Bucket
// and Key, when absent). A corrupt entry is no error here: Change.Corrupt.
func read(ctx context.Context, kv jetstream.KeyValue, key string) (Change, error) {
	e, err := kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Change{Bucket: kv.Bucket(), Key: key}, nil
	}
	if err != nil {
		return Change{}, fmt.Errorf("fleetkv: get %s: %w", key, err)
	}
	return Decode(kv.Bucket(), key, e.Revision(), e.Value()), nil
}

// ActiveRules returns the active ruleset entry and its KV revision (nil, 0
// when none was ever written). An entry that does not decode is a
// *CorruptError, returned with its revision.
func (k *KV) ActiveRules(ctx context.Context) (*tollgatev1.RulesEntry, uint64, error) {
	c, err := read(ctx, k.Rules, tollgatev1.RulesKey)
	if err != nil {
		return nil, 0, err
	}
	return c.Rules, c.Revision, c.Err()
}

// List returns a blocklist bucket entry and its revision (nil, 0 when
// absent). An entry that does not decode, or does not belong under key,
// is a *CorruptError, returned with its revision.
func (k *KV) List(ctx context.Context, key string) (*tollgatev1.ListEntry, uint64, error) {
	c, err := read(ctx, k.Lists, key)
	if err != nil {
		return nil, 0, err
	}
	return c.List, c.Revision, c.Err()
}

// Override returns an override entry and its revision (nil, 0 when
// absent). An entry that does not decode, or does not belong under key,
// is a *CorruptError, returned with its revision.
func (k *KV) Override(ctx context.Context, key string) (*tollgatev1.OverrideEntry, uint64, error) {
	c, err := read(ctx, k.Overrides, key)
	if err != nil {
		return nil, 0, err
	}
	return c.Override, c.Revision, c.Err()
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
	return rulesVersions(ctx, k.Rules)
}

func rulesVersions(ctx context.Context, kv jetstream.KeyValue) ([]RulesVersion, error) {
	hist, err := kv.History(ctx, tollgatev1.RulesKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fleetkv: rules history: %w", err)
	}
	var out []RulesVersion
	for _, h := range hist {
		if h.Operation() != jetstream.KeyValuePut {
			continue
		}
		c := Decode(tollgatev1.BucketRules, tollgatev1.RulesKey, h.Revision(), h.Value())
		out = append(out, RulesVersion{Revision: h.Revision(), Entry: c.Rules, Corrupt: c.Corrupt})
	}
	return out, nil
}

// PutRules writes e as the active ruleset if the entry's revision is still
// rev (0: there must be none), and returns the new revision. An entry
// without a Document gets one (WithDocument).
func (k *KV) PutRules(ctx context.Context, e *tollgatev1.RulesEntry, rev uint64) (uint64, error) {
	return k.put(ctx, k.Rules, tollgatev1.RulesKey, WithDocument(e, k.MaxValue()), rev)
}

// WithDocument returns e with its Document: Source parsed, in
// rules.EncodeDocument's form, so that each gateway decodes it instead of
// parsing YAML (at 200 gateways that parse was most of what a rule change
// cost the fleet). e itself when it has one already, when Source does not
// parse (the gateways then refuse it from Source, naming its problems), or
// when the value would exceed maxValue bytes with it (the gateways parse
// Source); else a copy.
func WithDocument(e *tollgatev1.RulesEntry, maxValue int) *tollgatev1.RulesEntry {
	if e == nil || len(e.Document) > 0 {
		return e
	}
	doc, err := rules.Parse([]byte(e.Source))
	if err != nil {
		return e
	}
	b, err := rules.EncodeDocument(doc)
	if err != nil {
		return e
	}
	with := *e
	with.Document = b
	if n, err := EncodedSize(&with); err != nil || n > maxValue {
		return e
	}
	return &with
}

// PutList writes a blocklist bucket entry under key if its revision is
// still rev (0: it must not exist), and returns the new revision.
func (k *KV) PutList(ctx context.Context, key string, e *tollgatev1.ListEntry, rev uint64) (uint64, error) {
	return k.put(ctx, k.Lists, key, e, rev)
}

// PutOverride writes an override under key if its revision is still rev
// (0: it must not exist), and returns the new revision.
func (k *KV) PutOverride(ctx context.Context, key string, e *tollgatev1.OverrideEntry, rev uint64) (uint64, error) {
	return k.put(ctx, k.Overrides, key, e, rev)
}

// EncodedSize is the size of e as a KV value, to compare with MaxValue.
func EncodedSize(e any) (int, error) {
	b, err := json.Marshal(e)
	return len(b), err
}

// put encodes e, refusing one above MaxValue, and writes it (write).
func (k *KV) put(ctx context.Context, kv jetstream.KeyValue, key string, e any, rev uint64) (uint64, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return 0, fmt.Errorf("fleetkv: encode: %w", err)
	}
	if max := k.MaxValue(); len(b) > max {
		return 0, fmt.Errorf("%w: %d bytes encoded, NATS takes at most %d", ErrTooLarge, len(b), max)
	}
	return write(ctx, kv, key, b, rev)
}

// verifyTimeout bounds reading an entry back after a write whose answer
// was lost.
const verifyTimeout = 2 * time.Second

// write writes key if its revision is still rev (0: it must not exist)
// and returns the new revision. A lost race is ErrConflict. A write that
// failed otherwise (a timeout, a dropped connection) may still have been
// applied, so the entry is read back: holding exactly value at a newer
// revision, the write counts as done; unchanged, the error stands; when
// the read fails too, ErrUnknownOutcome.
func write(ctx context.Context, kv jetstream.KeyValue, key string, value []byte, rev uint64) (uint64, error) {
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
	e, gerr := readBack(ctx, kv, key)
	switch {
	case gerr == nil && e.Revision() > rev && bytes.Equal(e.Value(), value):
		return e.Revision(), nil
	case gerr == nil && e.Revision() != rev:
		return 0, ErrConflict
	case errors.Is(gerr, jetstream.ErrKeyNotFound) && rev != 0:
		return 0, ErrConflict // deleted meanwhile
	case gerr == nil, errors.Is(gerr, jetstream.ErrKeyNotFound):
		return 0, fmt.Errorf("fleetkv: write %s: %w", key, err)
	}
	return 0, fmt.Errorf("fleetkv: write %s: %w (%w: reading it back: %v)", key, err, ErrUnknownOutcome, gerr)
}

// readBack reads key after a write or delete whose answer was lost, even
// when ctx has ended meanwhile (within verifyTimeout).
func readBack(ctx context.Context, kv jetstream.KeyValue, key string) (jetstream.KeyValueEntry, error) {
	vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), verifyTimeout)
	defer cancel()
	return kv.Get(vctx, key)
}

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

// Delete removes key from kv if its revision is still rev (0: whatever it
// is). A lost race is ErrConflict. As a write does, a delete that failed
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
	e, gerr := readBack(ctx, kv, key)
	switch {
	case errors.Is(gerr, jetstream.ErrKeyNotFound):
		return nil
	case gerr == nil && rev != 0 && e.Revision() != rev:
		return ErrConflict
	case gerr == nil:
		return fmt.Errorf("fleetkv: delete %s: %w", key, err)
	}
	return fmt.Errorf("fleetkv: delete %s: %w (%w: reading it back: %v)", key, err, ErrUnknownOutcome, gerr)
}
