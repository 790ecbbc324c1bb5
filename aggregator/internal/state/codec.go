package state

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// Key spaces. Changelog records carry primary keys (rows, marks) and
// their values verbatim; everything else is written by this package.
const (
	spaceRow    = 'r' // r tenant gran start key_id endpoint partition → row
	spaceMark   = 'h' // h partition gateway epoch → mark
	spaceByKey  = 'k' // k key_id gran start | row key → (index of rows by key_id)
	spaceOpen   = 'o' // o partition | row key → (rows not yet published)
	spaceExpiry = 'e' // e partition gran end | row key → (rows by window end)
	spaceOffset = 'c' // c topic partition → next offset to read of a materialized topic
	spaceMeta   = 'm' // m name → value
	// Penalty (abuse detector and ladder) state of a key, by the decisions
	// partition that owns it, and an index to find it by key_id alone.
	spacePenalty      = 'p' // p partition key_id → abuse.State
	spacePenaltyByKey = 'q' // q key_id partition → (index)
	// 'a' and 'A' hold the audit log, by time and by subject (audit.go).
)

// Topics materialized into the store, as the tag of their offsets.
const (
	TopicChangelog = 'l'
	TopicAudit     = 'a'
)

// errCorrupt is returned for keys or values this package cannot decode.
var errCorrupt = errors.New("state: corrupt record")

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func readString(b []byte) (string, []byte, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) < n {
		return "", nil, errCorrupt
	}
	return string(b[k : k+int(n)]), b[k+int(n):], nil
}

// appendInt64 appends v so that byte order is numeric order.
func appendInt64(b []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(v)^(1<<63))
}

func readInt64(b []byte) (int64, []byte, error) {
	if len(b) < 8 {
		return 0, nil, errCorrupt
	}
	return int64(binary.BigEndian.Uint64(b) ^ (1 << 63)), b[8:], nil
}

func appendPartition(b []byte, p int32) []byte { return binary.BigEndian.AppendUint32(b, uint32(p)) }

func readPartition(b []byte) (int32, []byte, error) {
	if len(b) < 4 {
		return 0, nil, errCorrupt
	}
	return int32(binary.BigEndian.Uint32(b)), b[4:], nil
}

// RowKey encodes a row's primary key (and changelog record key).
func RowKey(k windows.RowKey) []byte {
	b := make([]byte, 0, 16+len(k.Tenant)+len(k.KeyID)+len(k.Endpoint)+8)
	b = append(b, spaceRow)
	b = appendString(b, k.Tenant)
	b = append(b, byte(k.Gran))
	b = appendInt64(b, k.Start)
	b = appendString(b, k.KeyID)
	b = appendString(b, k.Endpoint)
	return appendPartition(b, k.Partition)
}

// tenantPrefix is the prefix of a tenant's rows of one granularity.
func tenantPrefix(tenant string, g windows.Granularity) []byte {
	b := append([]byte{spaceRow}, appendString(nil, tenant)...)
	return append(b, byte(g))
}

// DecodeRowKey is the inverse of RowKey.
func DecodeRowKey(b []byte) (windows.RowKey, error) {
	var k windows.RowKey
	if len(b) < 1 || b[0] != spaceRow {
		return k, errCorrupt
	}
	var err error
	if k.Tenant, b, err = readString(b[1:]); err != nil {
		return k, err
	}
	if len(b) < 1 {
		return k, errCorrupt
	}
	k.Gran, b = windows.Granularity(b[0]), b[1:]
	if k.Start, b, err = readInt64(b); err != nil {
		return k, err
	}
	if k.KeyID, b, err = readString(b); err != nil {
		return k, err
	}
	if k.Endpoint, b, err = readString(b); err != nil {
		return k, err
	}
	if k.Partition, b, err = readPartition(b); err != nil {
		return k, err
	}
	if len(b) != 0 {
		return k, errCorrupt
	}
	return k, nil
}

const rowVersion = 1

// RowValue encodes a row.
func RowValue(r windows.Row) []byte {
	b := make([]byte, 0, 32+len(r.KeyPrefix))
	b = append(b, rowVersion)
	b = appendString(b, r.KeyPrefix)
	b = binary.AppendVarint(b, r.Allowed)
	b = binary.AppendVarint(b, r.Rejected)
	b = binary.AppendVarint(b, r.Cost)
	flags := byte(0)
	if r.Closed {
		flags = 1
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(r.Revision))
	b = binary.AppendUvarint(b, uint64(len(r.Rules)))
	for _, id := range r.Rules {
		b = appendString(b, id)
	}
	return b
}

// versioned strips the version byte of an encoded value of the kind what,
// which must be version; any other is corrupt (or a format this build
// does not read).
func versioned(b []byte, version byte, what string) ([]byte, error) {
	if len(b) < 1 || b[0] != version {
		return nil, fmt.Errorf("%w: %s version", errCorrupt, what)
	}
	return b[1:], nil
}

// DecodeRowValue is the inverse of RowValue.
func DecodeRowValue(b []byte) (windows.Row, error) {
	var r windows.Row
	b, err := versioned(b, rowVersion, "row")
	if err != nil {
		return r, err
	}
	if r.KeyPrefix, b, err = readString(b); err != nil {
		return r, err
	}
	for _, p := range []*int64{&r.Allowed, &r.Rejected, &r.Cost} {
		v, n := binary.Varint(b)
		if n <= 0 {
			return r, errCorrupt
		}
		*p, b = v, b[n:]
	}
	if len(b) < 1 {
		return r, errCorrupt
	}
	r.Closed, b = b[0]&1 != 0, b[1:]
	rev, n := binary.Uvarint(b)
	if n <= 0 {
		return r, errCorrupt
	}
	r.Revision, b = uint32(rev), b[n:]
	cnt, n := binary.Uvarint(b)
	if n <= 0 || cnt > windows.MaxRules {
		return r, errCorrupt
	}
	b = b[n:]
	for range cnt {
		var id string
		if id, b, err = readString(b); err != nil {
			return r, err
		}
		r.Rules = append(r.Rules, id)
	}
	return r, nil
}

// MarkKey encodes a source's mark key.
func MarkKey(s windows.Source) []byte {
	b := make([]byte, 0, 16+len(s.Gateway))
	b = append(b, spaceMark)
	b = appendPartition(b, s.Partition)
	b = appendString(b, s.Gateway)
	return binary.BigEndian.AppendUint64(b, s.Epoch)
}

func markPrefix(p int32) []byte { return appendPartition([]byte{spaceMark}, p) }

// DecodeMarkKey is the inverse of MarkKey.
func DecodeMarkKey(b []byte) (windows.Source, error) {
	var s windows.Source
	if len(b) < 1 || b[0] != spaceMark {
		return s, errCorrupt
	}
	var err error
	if s.Partition, b, err = readPartition(b[1:]); err != nil {
		return s, err
	}
	if s.Gateway, b, err = readString(b); err != nil {
		return s, err
	}
	if len(b) != 8 {
		return s, errCorrupt
	}
	s.Epoch = binary.BigEndian.Uint64(b)
	return s, nil
}

// MarkValue encodes a mark: version 1, the high-water mark, missing,
// closed and seen, then — only when one of them is set — the held run and
// the open gap. A reader that knows only the first part ignores the rest
// (they were added later), so instances of both builds can share a
// changelog while they are upgraded.
func MarkValue(m windows.Mark) []byte {
	b := []byte{1}
	b = binary.AppendUvarint(b, m.HWM)
	b = binary.AppendUvarint(b, m.Missing)
	c := byte(0)
	if m.Closed {
		c = 1
	}
	b = append(b, c)
	b = binary.AppendVarint(b, m.Seen)
	if m.HeldCount == 0 && m.GapNext == 0 {
		return b
	}
	for _, v := range []uint64{m.HeldFirst, m.HeldLast, m.HeldCount, m.GapNext, m.GapLast} {
		b = binary.AppendUvarint(b, v)
	}
	return b
}

// DecodeMarkValue is the inverse of MarkValue.
func DecodeMarkValue(b []byte) (windows.Mark, error) {
	var m windows.Mark
	if len(b) < 1 || b[0] != 1 {
		return m, errCorrupt
	}
	b = b[1:]
	var n int
	if m.HWM, n = binary.Uvarint(b); n <= 0 {
		return m, errCorrupt
	}
	b = b[n:]
	if m.Missing, n = binary.Uvarint(b); n <= 0 {
		return m, errCorrupt
	}
	b = b[n:]
	if len(b) < 1 {
		return m, errCorrupt
	}
	m.Closed, b = b[0] == 1, b[1:]
	if m.Seen, n = binary.Varint(b); n <= 0 {
		return m, errCorrupt
	}
	b = b[n:]
	if len(b) == 0 {
		return m, nil
	}
	for _, p := range []*uint64{&m.HeldFirst, &m.HeldLast, &m.HeldCount, &m.GapNext, &m.GapLast} {
		if *p, n = binary.Uvarint(b); n <= 0 {
			return m, errCorrupt
		}
		b = b[n:]
	}
	if len(b) != 0 || m.HeldCount > 0 && m.HeldFirst+m.HeldCount-1 != m.HeldLast || m.GapNext > m.GapLast {
		return m, errCorrupt
	}
	return m, nil
}

// derived keys of a row: by key_id, by window end, and (while open) open.
func byKeyKey(k windows.RowKey, primary []byte) []byte {
	b := append([]byte{spaceByKey}, appendString(nil, k.KeyID)...)
	b = append(b, byte(k.Gran))
	b = appendInt64(b, k.Start)
	return append(b, primary...)
}

func keyPrefix(keyID string, g windows.Granularity) []byte {
	b := append([]byte{spaceByKey}, appendString(nil, keyID)...)
	return append(b, byte(g))
}

func openKey(p int32, primary []byte) []byte {
	return append(appendPartition([]byte{spaceOpen}, p), primary...)
}

func expiryKey(k windows.RowKey, primary []byte) []byte {
	b := appendPartition([]byte{spaceExpiry}, k.Partition)
	b = append(b, byte(k.Gran))
	b = appendInt64(b, k.End())
	return append(b, primary...)
}

func offsetKey(topic byte, p int32) []byte { return appendPartition([]byte{spaceOffset, topic}, p) }

func metaKey(name string) []byte { return append([]byte{spaceMeta}, name...) }

// prefixEnd returns the first key after every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}

// PenaltyKey encodes the key of a key's penalty state in partition p (and
// its changelog record key).
func PenaltyKey(p int32, keyID string) []byte {
	b := make([]byte, 0, 6+len(keyID))
	b = appendPartition(append(b, spacePenalty), p)
	return appendString(b, keyID)
}

func penaltyPrefix(p int32) []byte { return appendPartition([]byte{spacePenalty}, p) }

// DecodePenaltyKey is the inverse of PenaltyKey.
func DecodePenaltyKey(b []byte) (int32, string, error) {
	if len(b) < 1 || b[0] != spacePenalty {
		return 0, "", errCorrupt
	}
	p, b, err := readPartition(b[1:])
	if err != nil {
		return 0, "", err
	}
	id, b, err := readString(b)
	if err != nil || len(b) != 0 {
		return 0, "", errCorrupt
	}
	return p, id, nil
}

func penaltyByKeyKey(keyID string, p int32) []byte {
	return appendPartition(appendString([]byte{spacePenaltyByKey}, keyID), p)
}

const penaltyVersion = 1

// PenaltyValue encodes a key's penalty state.
func PenaltyValue(s abuse.State) []byte {
	b := make([]byte, 0, 96+len(s.Tenant)+len(s.KeyPrefix))
	b = append(b, penaltyVersion)
	b = appendString(b, s.Tenant)
	b = appendString(b, s.KeyPrefix)
	b = binary.AppendUvarint(b, uint64(s.Level))
	b = binary.AppendUvarint(b, s.Step)
	for _, v := range []int64{s.Since, s.Until, s.LastFiring, s.VolumeAt, s.Floor, s.LiftedAt, s.RetryFrom, s.RetryUntil, s.Touched} {
		b = binary.AppendVarint(b, v)
	}
	n := 0
	for _, k := range s.Ring {
		if k.Requests > 0 {
			n++
		}
	}
	b = append(b, byte(n))
	for i, k := range s.Ring {
		if k.Requests == 0 {
			continue
		}
		b = append(b, byte(i))
		for _, v := range []int64{k.Start, k.Requests, k.Rejected, k.Ignored, k.First, k.Last} {
			b = binary.AppendVarint(b, v)
		}
	}
	return b
}

// DecodePenaltyValue is the inverse of PenaltyValue.
func DecodePenaltyValue(b []byte) (abuse.State, error) {
	var s abuse.State
	b, err := versioned(b, penaltyVersion, "penalty")
	if err != nil {
		return s, err
	}
	if s.Tenant, b, err = readString(b); err != nil {
		return s, err
	}
	if s.KeyPrefix, b, err = readString(b); err != nil {
		return s, err
	}
	level, n := binary.Uvarint(b)
	if n <= 0 || level > abuse.MaxLevel {
		return s, errCorrupt
	}
	s.Level, b = int(level), b[n:]
	if s.Step, n = binary.Uvarint(b); n <= 0 {
		return s, errCorrupt
	}
	b = b[n:]
	for _, p := range []*int64{&s.Since, &s.Until, &s.LastFiring, &s.VolumeAt, &s.Floor, &s.LiftedAt, &s.RetryFrom, &s.RetryUntil, &s.Touched} {
		if *p, n = binary.Varint(b); n <= 0 {
			return s, errCorrupt
		}
		b = b[n:]
	}
	if len(b) < 1 || int(b[0]) > abuse.Buckets {
		return s, errCorrupt
	}
	cnt := int(b[0])
	b = b[1:]
	for range cnt {
		if len(b) < 1 || int(b[0]) >= abuse.Buckets {
			return s, errCorrupt
		}
		k := &s.Ring[b[0]]
		b = b[1:]
		for _, p := range []*int64{&k.Start, &k.Requests, &k.Rejected, &k.Ignored, &k.First, &k.Last} {
			if *p, n = binary.Varint(b); n <= 0 {
				return s, errCorrupt
			}
			b = b[n:]
		}
	}
	if len(b) != 0 {
		return s, errCorrupt
	}
	return s, nil
}
