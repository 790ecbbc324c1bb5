// Package fleetkv is the fleet's control plane in NATS, for both of its
// ends: the aggregator, whose operator API and penalty outbox write the
// JetStream KV buckets, and the gateways, which watch them. It owns the
// connection (Connect), the buckets and their settings (Open creates them,
// Follow binds them), the writes, conditional on the revision they replace
// (KV), the watch of every key with a fresh read after every reconnect
// (Conn.Follow), the decoding of every value with its corrupt-entry check
// (Decode), and what the entries mean to a gateway's guard.Controls
// (Entries). The values themselves, the bucket names and the penalty
// ladder's levels are the wire contract, in schemas/tollgatev1.
//
// The buckets: tollgate_rules (key active: the ruleset, history kept for
// rollback), tollgate_blocklist (blocked, penalised and allowlisted keys,
// by key_id) and tollgate_overrides (key.<key_id>, tenant.<base64url>);
// and tollgate_gateways, which the gateways write and the operator API
// reads: one entry per gateway, by gateway_id, that expires by itself
// (Announcer, Gateways).
// Beside them, core NATS subject tollgatev1.SubjectCounters tells gateways
// that the operator API changed a key's counters in Redis.
//
// # Writes
//
// Every write is conditional on the revision it replaces (KV Update, or
// Create for a new key), so two writers never overwrite each other
// unknowingly: a lost race is ErrConflict. A write that failed otherwise
// (a timeout, a dropped connection) may still have been applied, so the
// entry is read back before the error is believed. The connection never
// replays a write after a reconnect (Connect sets no reconnect buffer):
// otherwise a put that timed out while NATS was down would still be sent
// after the reconnect and applied behind the caller's back.
//
// # Corrupt entries
//
// An entry that does not decode, or that sits under a KV key its content
// does not belong to (written to NATS by hand, or damaged), is corrupt:
// Decode says so from the bucket's content alone, the same way at both
// ends, so that the operator API shows and repairs exactly the entries the
// gateways treat as corrupt. What a corrupt entry does on a gateway is
// Entries' (a corrupt blocklist entry blocks its key_id).
package fleetkv

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Errors.
var (
	// ErrConflict: the entry changed since the revision the write expected.
	ErrConflict = errors.New("fleetkv: entry changed meanwhile")
	// ErrNotFound: a bucket does not exist (yet).
	ErrNotFound = errors.New("fleetkv: not found")
	// ErrCorrupt: an entry is present but does not decode, or sits under a
	// KV key its content does not belong to; errors.As finds the
	// *CorruptError with its revision.
	ErrCorrupt = errors.New("fleetkv: corrupt entry")
	// ErrUnknownOutcome: a write failed in a way that leaves open whether
	// NATS applied it, and reading the entry back failed too.
	ErrUnknownOutcome = errors.New("fleetkv: outcome of the write unknown")
	// ErrTooLarge: a value larger than NATS accepts (KV.MaxValue).
	ErrTooLarge = errors.New("fleetkv: value too large")
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
	return fmt.Sprintf("fleetkv: %s entry %q (revision %d, %d bytes) is corrupt: %v", e.Bucket, e.Key, e.Revision, e.Bytes, e.Err)
}

// Unwrap makes errors.Is(err, ErrCorrupt) true, and reaches the cause.
func (e *CorruptError) Unwrap() []error { return []error{ErrCorrupt, e.Err} }

// Change is one entry of a bucket as read: a value, decoded (Rules, List,
// Override or Gateway, by Bucket) or Corrupt, or a deletion.
type Change struct {
	Bucket   string
	Key      string
	Revision uint64
	// Deleted: the key was deleted or purged; no value.
	Deleted  bool
	Rules    *tollgatev1.RulesEntry
	List     *tollgatev1.ListEntry
	Override *tollgatev1.OverrideEntry
	Gateway  *tollgatev1.GatewayEntry
	Corrupt  *CorruptError
}

// Err is Corrupt as an error: nil when the entry is not corrupt.
func (c Change) Err() error {
	if c.Corrupt == nil {
		return nil
	}
	return c.Corrupt
}

// Decode decodes value, the entry at revision rev under key in bucket (a
// tollgatev1 bucket name), and checks that it belongs under key. A value
// of another bucket is corrupt.
func Decode(bucket, key string, rev uint64, value []byte) Change {
	c := Change{Bucket: bucket, Key: key, Revision: rev}
	var err error
	switch bucket {
	case tollgatev1.BucketRules:
		c.Rules, err = tollgatev1.DecodeRulesEntry(value)
	case tollgatev1.BucketBlocklist:
		c.List, err = tollgatev1.DecodeListEntry(value)
		if err == nil {
			err = tollgatev1.CheckListKey(key, c.List)
		}
	case tollgatev1.BucketOverrides:
		c.Override, err = tollgatev1.DecodeOverrideEntry(value)
		if err == nil {
			err = tollgatev1.CheckOverrideKey(key, c.Override)
		}
	case tollgatev1.BucketGateways:
		c.Gateway, err = tollgatev1.DecodeGatewayEntry(value)
		if err == nil {
			err = tollgatev1.CheckGatewayKey(key, c.Gateway)
		}
	default:
		err = fmt.Errorf("no bucket %q in the control plane", bucket)
	}
	if err != nil {
		sum := sha256.Sum256(value)
		return Change{Bucket: bucket, Key: key, Revision: rev, Corrupt: &CorruptError{Bucket: bucket, Key: key, Revision: rev,
			Bytes: len(value), SHA256: hex.EncodeToString(sum[:]), Err: err}}
	}
	return c
}
