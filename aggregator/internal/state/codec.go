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

// The versions of the values this build writes and reads (the first byte
// of each): another is refused as corrupt, naming the kind.
const (
	rowVersion     = 1
	markVersion    = 1
	penaltyVersion = 1
)

// errCorrupt is returned for keys or values this package cannot decode.
var errCorrupt = errors.New("state: corrupt record")

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// reader reads an encoded key or value front to back. A read past the
// end, or of a malformed number, spoils it: that read and every later one
// return zero, and err and end report errCorrupt. Its reads mirror the
// append functions.
type reader struct {
	b   []byte
	bad bool
	// version names the value whose version byte was not this build's
	// ("row"), for the error.
	version string
}

func (r *reader) fail() { r.b, r.bad = nil, true }

// err is errCorrupt when a read failed.
func (r *reader) err() error {
	switch {
	case r.version != "":
		return fmt.Errorf("%w: %s version", errCorrupt, r.version)
	case r.bad:
		return errCorrupt
	}
	return nil
}

// end is errCorrupt when a read failed or bytes are left.
func (r *reader) end() error {
	if len(r.b) != 0 {
		r.fail()
	}
	return r.err()
}

func (r *reader) byte() byte { return r.fixed(1)[0] }

// expect reads the byte c (a key's space); any other spoils r.
func (r *reader) expect(c byte) {
	if r.byte() != c {
		r.fail()
	}
}

// versioned reads the version byte of a value of the kind what ("row"),
// v in this build; any other (a corrupt value, or a format this build
// does not read) spoils r, and err names it.
func (r *reader) versioned(v byte, what string) {
	if !r.bad && r.byte() != v {
		r.fail()
		r.version = what
	}
}

func (r *reader) string() string {
	n, k := binary.Uvarint(r.b)
	if k <= 0 || uint64(len(r.b)-k) < n {
		r.fail()
		return ""
	}
	s := string(r.b[k : k+int(n)])
	r.b = r.b[k+int(n):]
	return s
}

func (r *reader) fixed(n int) []byte {
	if len(r.b) < n {
		r.fail()
		return make([]byte, n)
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}

// int64 reads what appendInt64 wrote.
func (r *reader) int64() int64 { return int64(binary.BigEndian.Uint64(r.fixed(8)) ^ (1 << 63)) }

func (r *reader) uint64() uint64 { return binary.BigEndian.Uint64(r.fixed(8)) }

func (r *reader) partition() int32 { return int32(binary.BigEndian.Uint32(r.fixed(4))) }

// varint and uvarint read what binary.AppendVarint and AppendUvarint
// wrote; binary's readers return 0 for a malformed number.
func (r *reader) varint() int64 {
	v, n := binary.Varint(r.b)
	r.took(n)
	return v
}

func (r *reader) uvarint() uint64 {
	v, n := binary.Uvarint(r.b)
	r.took(n)
	return v
}

// took moves past the n bytes a binary reader read, n <= 0 for a failed
// read.
func (r *reader) took(n int) {
	if n <= 0 {
		r.fail()
		return
	}
	r.b = r.b[n:]
}

// appendBool appends v as a byte, 1 or 0.
func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

// appendInt64 appends v so that byte order is numeric order.
func appendInt64(b []byte, v int64) []byte {
	return binary.BigEndian.AppendUint64(b, uint64(v)^(1<<63))
}

func appendPartition(b []byte, p int32) []byte { return binary.BigEndian.AppendUint32(b, uint32(p)) }

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
	r := reader{b: b}
	r.expect(spaceRow)
	var k windows.RowKey
	k.Tenant = r.string()
	k.Gran = windows.Granularity(r.byte())
	k.Start = r.int64()
	k.KeyID = r.string()
	k.Endpoint = r.string()
	k.Partition = r.partition()
	return k, r.end()
}

// RowValue encodes a row.
func RowValue(r windows.Row) []byte {
	b := make([]byte, 0, 32+len(r.KeyPrefix))
	b = append(b, rowVersion)
	b = appendString(b, r.KeyPrefix)
	b = binary.AppendVarint(b, r.Allowed)
	b = binary.AppendVarint(b, r.Rejected)
	b = binary.AppendVarint(b, r.Cost)
	b = appendBool(b, r.Closed)
	b = binary.AppendUvarint(b, uint64(r.Revision))
	b = binary.AppendUvarint(b, uint64(len(r.Rules)))
	for _, id := range r.Rules {
		b = appendString(b, id)
	}
	return b
}

// DecodeRowValue is the inverse of RowValue.
func DecodeRowValue(b []byte) (windows.Row, error) {
	var row windows.Row
	r := reader{b: b}
	r.versioned(rowVersion, "row")
	row.KeyPrefix = r.string()
	row.Allowed, row.Rejected, row.Cost = r.varint(), r.varint(), r.varint()
	row.Closed = r.byte()&1 != 0
	row.Revision = uint32(r.uvarint())
	cnt := r.uvarint()
	if cnt > windows.MaxRules {
		r.fail()
	}
	for range cnt {
		if r.bad {
			break
		}
		row.Rules = append(row.Rules, r.string())
	}
	return row, r.err()
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
	r := reader{b: b}
	r.expect(spaceMark)
	var s windows.Source
	s.Partition = r.partition()
	s.Gateway = r.string()
	s.Epoch = r.uint64()
	return s, r.end()
}

// MarkValue encodes a mark: version 1, the high-water mark, missing,
// closed and seen, then — only when one of them is set — the held run and
// the open gap. A reader that knows only the first part ignores the rest
// (they were added later), so instances of both builds can share a
// changelog while they are upgraded.
func MarkValue(m windows.Mark) []byte {
	b := []byte{markVersion}
	b = binary.AppendUvarint(b, m.HWM)
	b = binary.AppendUvarint(b, m.Missing)
	b = appendBool(b, m.Closed)
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
	r := reader{b: b}
	r.versioned(markVersion, "mark")
	var m windows.Mark
	m.HWM, m.Missing = r.uvarint(), r.uvarint()
	m.Closed = r.byte() == 1
	m.Seen = r.varint()
	if len(r.b) == 0 {
		return m, r.err()
	}
	for _, p := range []*uint64{&m.HeldFirst, &m.HeldLast, &m.HeldCount, &m.GapNext, &m.GapLast} {
		*p = r.uvarint()
	}
	if m.HeldCount > 0 && m.HeldFirst+m.HeldCount-1 != m.HeldLast || m.GapNext > m.GapLast {
		r.fail()
	}
	return m, r.end()
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
	r := reader{b: b}
	r.expect(spacePenalty)
	p, id := r.partition(), r.string()
	if err := r.end(); err != nil {
		return 0, "", err
	}
	return p, id, nil
}

func penaltyByKeyKey(keyID string, p int32) []byte {
	return appendPartition(appendString([]byte{spacePenaltyByKey}, keyID), p)
}

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
	r := reader{b: b}
	r.versioned(penaltyVersion, "penalty")
	s.Tenant, s.KeyPrefix = r.string(), r.string()
	level := r.uvarint()
	if level > abuse.MaxLevel {
		r.fail()
	}
	s.Level, s.Step = int(level), r.uvarint()
	for _, p := range []*int64{&s.Since, &s.Until, &s.LastFiring, &s.VolumeAt, &s.Floor, &s.LiftedAt, &s.RetryFrom, &s.RetryUntil, &s.Touched} {
		*p = r.varint()
	}
	cnt := int(r.byte())
	if cnt > abuse.Buckets {
		r.fail()
	}
	for range cnt {
		i := int(r.byte())
		if r.bad || i >= abuse.Buckets {
			r.fail()
			break
		}
		k := &s.Ring[i]
		for _, p := range []*int64{&k.Start, &k.Requests, &k.Rejected, &k.Ignored, &k.First, &k.Last} {
			*p = r.varint()
		}
	}
	return s, r.end()
}
