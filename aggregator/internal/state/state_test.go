package state

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

func open(t *testing.T) *DB {
	t.Helper()
	db, err := Open(t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	return db
}

func rowRec(p int32, off int64, k windows.RowKey, r *windows.Row) Record {
	rec := Record{Partition: p, Offset: off, Key: RowKey(k)}
	if r != nil {
		rec.Value = RowValue(*r)
	}
	return rec
}

func TestCodecRoundTrip(t *testing.T) {
	k := windows.RowKey{Partition: 7, Tenant: "acme\x00x", KeyID: "kid", Endpoint: "/v1/a", Gran: windows.Hour, Start: -3600}
	got, err := DecodeRowKey(RowKey(k))
	if err != nil || got != k {
		t.Fatalf("row key: %+v %v", got, err)
	}
	r := windows.Row{KeyPrefix: "sk_a…", Allowed: 3, Rejected: -2, Cost: 1 << 40, Rules: []string{"a", "b"}, Closed: true, Revision: 9}
	gr, err := DecodeRowValue(RowValue(r))
	if err != nil || !reflect.DeepEqual(gr, r) {
		t.Fatalf("row: %+v %v", gr, err)
	}
	s := windows.Source{Gateway: "gw-1", Epoch: 1 << 63, Partition: 2}
	gs, err := DecodeMarkKey(MarkKey(s))
	if err != nil || gs != s {
		t.Fatalf("mark key: %+v %v", gs, err)
	}
	m := windows.Mark{HWM: 10, Missing: 2, Closed: true, Seen: 99}
	gm, err := DecodeMarkValue(MarkValue(m))
	if err != nil || gm != m {
		t.Fatalf("mark: %+v %v", gm, err)
	}
}

// TestMarkKeepsHeldRunsAndGaps: a mark's held run and open gap survive the
// changelog (so a forged jump stays held, and its gap open, across
// restarts and rebalances), and marks written before they existed, or by a
// build that does not know them, still read.
func TestMarkKeepsHeldRunsAndGaps(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		m    windows.Mark
	}{
		{"plain", windows.Mark{HWM: 10, Missing: 2, Seen: 99}},
		{"held", windows.Mark{HWM: 33, Seen: 5, HeldFirst: 1_000_000, HeldLast: 1_000_002, HeldCount: 3}},
		{"gap", windows.Mark{HWM: 500, Missing: 489, Seen: 5, GapNext: 11, GapLast: 499}},
		{"both, closed", windows.Mark{HWM: 500, Missing: 489, Closed: true, Seen: -5, HeldFirst: 200_000, HeldLast: 200_000, HeldCount: 1, GapNext: 11, GapLast: 499}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			v := MarkValue(tc.m)
			got, err := DecodeMarkValue(v)
			if err != nil || got != tc.m {
				t.Fatalf("mark %+v decoded as %+v, %v", tc.m, got, err)
			}
			// The first part is what the first version of the format
			// holds, and what a reader of it decodes.
			v1 := MarkValue(windows.Mark{HWM: tc.m.HWM, Missing: tc.m.Missing, Closed: tc.m.Closed, Seen: tc.m.Seen})
			if !bytes.HasPrefix(v, v1) {
				t.Fatalf("%x does not start with the plain mark %x", v, v1)
			}
			if got, err := DecodeMarkValue(v1); err != nil || got.HWM != tc.m.HWM || got.HeldCount != 0 {
				t.Fatalf("plain mark decoded as %+v, %v", got, err)
			}
		})
	}
	for _, bad := range []windows.Mark{
		{HWM: 1, HeldFirst: 10, HeldLast: 9, HeldCount: 1},
		{HWM: 1, GapNext: 10, GapLast: 9},
	} {
		if _, err := DecodeMarkValue(MarkValue(bad)); err == nil {
			t.Errorf("inconsistent mark %+v decoded", bad)
		}
	}
}

// TestTotalsSaturate: rows whose sum overflows int64 add up to the largest
// int64 in reports and totals, never to a negative number.
func TestTotalsSaturate(t *testing.T) {
	t.Parallel()
	db := open(t)
	k := func(p int32, key string) windows.RowKey {
		return windows.RowKey{Partition: p, Tenant: "acme", KeyID: key, Endpoint: "/a", Gran: windows.Day, Start: 0}
	}
	big := &windows.Row{Allowed: 1, Cost: 9_000_000_000_000_000_000}
	if err := db.Materialize([]Record{rowRec(0, 0, k(0, "k1"), big), rowRec(1, 0, k(1, "k1"), big), rowRec(0, 1, k(0, "k2"), big)}); err != nil {
		t.Fatal(err)
	}
	rows, _, err := db.Report(Query{Tenant: "acme", Gran: windows.Day, From: 0, To: 86400})
	if err != nil || len(rows) != 2 || rows[0].Cost != math.MaxInt64 {
		t.Fatalf("report %+v %v: want the first row's cost saturated", rows, err)
	}
	_, _, cost, err := db.Totals(Query{Tenant: "acme", Gran: windows.Day, From: 0, To: 86400})
	if err != nil || cost != math.MaxInt64 {
		t.Fatalf("total cost %d %v, want %d", cost, err, int64(math.MaxInt64))
	}
	tt, err := db.TenantTotals()
	if err != nil || len(tt) != 1 || tt[0].Cost != math.MaxInt64 {
		t.Fatalf("tenant totals %+v %v", tt, err)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add(RowKey(windows.RowKey{Tenant: "t", Gran: windows.Minute}))
	f.Add(RowValue(windows.Row{Rules: []string{"x"}}))
	f.Add(MarkValue(windows.Mark{HWM: 1}))
	f.Fuzz(func(t *testing.T, b []byte) {
		if k, err := DecodeRowKey(b); err == nil {
			if k2, err := DecodeRowKey(RowKey(k)); err != nil || k2 != k {
				t.Fatalf("row key does not round-trip: %+v", k)
			}
		}
		if r, err := DecodeRowValue(b); err == nil {
			if r2, err := DecodeRowValue(RowValue(r)); err != nil || !reflect.DeepEqual(r, r2) {
				t.Fatalf("row does not round-trip: %+v", r)
			}
		}
		_, _ = DecodeMarkKey(b)
		_, _ = DecodeMarkValue(b)
	})
}

func TestMaterializeAndReport(t *testing.T) {
	db := open(t)
	k := func(p int32, key, ep string, start int64) windows.RowKey {
		return windows.RowKey{Partition: p, Tenant: "acme", KeyID: key, Endpoint: ep, Gran: windows.Minute, Start: start}
	}
	row := func(a int64, closed bool) *windows.Row {
		return &windows.Row{KeyPrefix: "sk_…", Allowed: a, Rejected: 1, Cost: a, Closed: closed}
	}
	recs := []Record{
		rowRec(0, 0, k(0, "k1", "/a", 60), row(1, false)),
		rowRec(0, 1, k(0, "k1", "/a", 60), row(5, false)), // upsert
		rowRec(1, 0, k(1, "k1", "/a", 60), row(2, true)),  // another partition: summed
		rowRec(0, 2, k(0, "k2", "/a", 60), row(3, true)),
		rowRec(0, 3, k(0, "k1", "/a", 120), row(4, false)),
		{Partition: 0, Offset: 4, Control: true},
	}
	if err := db.Materialize(recs); err != nil {
		t.Fatal(err)
	}
	// Replaying is harmless.
	if err := db.Materialize(recs[:2]); err != nil {
		t.Fatal(err)
	}
	if off, _ := db.Offset(TopicChangelog, 0); off != 5 {
		t.Fatalf("offset = %d, want 5", off)
	}
	rows, next, err := db.Report(Query{Tenant: "acme", Gran: windows.Minute, From: 0, To: 1000})
	if err != nil || next != "" {
		t.Fatal(err, next)
	}
	want := []ReportRow{
		{Start: 60, KeyID: "k1", KeyPrefix: "sk_…", Endpoint: "/a", Allowed: 7, Rejected: 2, Cost: 7},
		{Start: 60, KeyID: "k2", KeyPrefix: "sk_…", Endpoint: "/a", Allowed: 3, Rejected: 1, Cost: 3},
		{Start: 120, KeyID: "k1", KeyPrefix: "sk_…", Endpoint: "/a", Allowed: 4, Rejected: 1, Cost: 4},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Fatalf("report:\n got %+v\nwant %+v", rows, want)
	}
	// Paging one row at a time gives the same rows.
	var paged []ReportRow
	cursor := ""
	for range 10 {
		r, n, err := db.Report(Query{Tenant: "acme", Gran: windows.Minute, From: 0, To: 1000, Limit: 1, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		paged = append(paged, r...)
		if cursor = n; cursor == "" {
			break
		}
	}
	if !reflect.DeepEqual(paged, want) {
		t.Fatalf("paged:\n got %+v\nwant %+v", paged, want)
	}
	byKey, _, err := db.Report(Query{KeyID: "k1", Gran: windows.Minute, From: 0, To: 1000})
	if err != nil || len(byKey) != 2 || byKey[0].Allowed != 7 {
		t.Fatalf("key report %+v %v", byKey, err)
	}
	// Open rows of partition 0: k1@60 and k1@120 (k2 is closed).
	open, _, err := db.LoadPartition(0)
	if err != nil || len(open) != 2 {
		t.Fatalf("open rows %+v %v", open, err)
	}
	// A tombstone removes the row and its indexes.
	if err := db.Materialize([]Record{rowRec(0, 5, k(0, "k1", "/a", 120), nil)}); err != nil {
		t.Fatal(err)
	}
	open, _, _ = db.LoadPartition(0)
	byKey, _, _ = db.Report(Query{KeyID: "k1", Gran: windows.Minute, From: 0, To: 1000})
	if len(open) != 1 || len(byKey) != 1 {
		t.Fatalf("after tombstone: open %d, key rows %d", len(open), len(byKey))
	}
	var expired []int64
	_ = db.ExpiredRows(0, windows.Minute, 1000, func(k windows.RowKey) bool { expired = append(expired, k.Start); return true })
	if fmt.Sprint(expired) != "[60 60]" {
		t.Fatalf("expired = %v", expired)
	}
	if _, _, err := db.Report(Query{Tenant: "acme", Gran: windows.Minute, To: 1000, Cursor: "garbage"}); err == nil {
		t.Fatal("bad cursor accepted")
	}
}

func TestIdentityAndCheckpoint(t *testing.T) {
	db := open(t)
	if wiped, err := db.CheckIdentity("cluster-a/topic-1"); err != nil || wiped {
		t.Fatal(wiped, err)
	}
	k := windows.RowKey{Tenant: "t", Gran: windows.Day}
	if err := db.Materialize([]Record{rowRec(0, 0, k, &windows.Row{Allowed: 1})}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "snap")
	if err := db.Checkpoint(dir); err != nil {
		t.Fatal(err)
	}
	if wiped, _ := db.CheckIdentity("cluster-a/topic-1"); wiped {
		t.Fatal("same identity wiped")
	}
	if wiped, _ := db.CheckIdentity("cluster-b/topic-1"); !wiped {
		t.Fatal("another identity kept the rows")
	}
	if _, ok, _ := db.Row(k); ok {
		t.Fatal("row survived the wipe")
	}
	if off, _ := db.Offset(TopicChangelog, 0); off != 0 {
		t.Fatal("offset survived the wipe")
	}
	snap, err := OpenReadOnly(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer snap.Close()
	if r, ok, _ := snap.Row(k); !ok || r.Allowed != 1 {
		t.Fatal("checkpoint lost the row")
	}
}

func TestPenaltyCodecAndMaterialize(t *testing.T) {
	s := abuse.State{Tenant: "acme", KeyPrefix: "sk_…", Level: 2, Step: 7, Since: 1, Until: -2, LastFiring: 3, VolumeAt: 4,
		Floor: 5, LiftedAt: 6, RetryFrom: 7, RetryUntil: 1 << 60, Touched: 9}
	s.Ring[1] = abuse.Bucket{Start: 10, Requests: 11, Rejected: 12, Ignored: 13, First: 14, Last: 15}
	s.Ring[5] = abuse.Bucket{Start: -10, Requests: 1}
	got, err := DecodePenaltyValue(PenaltyValue(s))
	if err != nil || got != s {
		t.Fatalf("penalty: %+v %v", got, err)
	}
	p, id, err := DecodePenaltyKey(PenaltyKey(4, "kid\x00"))
	if err != nil || p != 4 || id != "kid\x00" {
		t.Fatalf("penalty key: %d %q %v", p, id, err)
	}
	v := PenaltyValue(s)
	for i := range v {
		if _, err := DecodePenaltyValue(v[:i]); err == nil {
			t.Fatalf("truncated value (%d of %d bytes) decoded", i, len(v))
		}
	}

	db := open(t)
	other := s
	other.Level = 1
	err = db.Materialize([]Record{
		{Partition: 4, Offset: 0, Key: PenaltyKey(4, "k1"), Value: PenaltyValue(s)},
		{Partition: 4, Offset: 1, Key: PenaltyKey(4, "k2"), Value: PenaltyValue(s)},
		{Partition: 1, Offset: 0, Key: PenaltyKey(1, "k1"), Value: PenaltyValue(other)},
	})
	if err != nil {
		t.Fatal(err)
	}
	states, err := db.LoadPenalties(4)
	if err != nil || len(states) != 2 || states["k1"] != s {
		t.Fatalf("LoadPenalties: %v %v", states, err)
	}
	byKey, err := db.Penalties("k1")
	if err != nil || len(byKey) != 2 || byKey[0].Partition != 1 || byKey[0].State != other || byKey[1].Partition != 4 {
		t.Fatalf("Penalties(k1): %+v %v", byKey, err)
	}
	// A tombstone removes the state and its index entry.
	if err := db.Materialize([]Record{{Partition: 4, Offset: 2, Key: PenaltyKey(4, "k1")}}); err != nil {
		t.Fatal(err)
	}
	byKey, _ = db.Penalties("k1")
	states, _ = db.LoadPenalties(4)
	if len(byKey) != 1 || byKey[0].Partition != 1 || len(states) != 1 {
		t.Fatalf("after a tombstone: %+v %v", byKey, states)
	}
	if got, _ := db.Penalties("k"); len(got) != 0 {
		t.Fatalf("Penalties(k) matched another key: %+v", got)
	}
}

// TestUnknownValueVersionIsCorrupt: a row or penalty value whose version
// byte is missing or not this build's is refused as corrupt, naming the
// kind of value; the build's own encoding decodes.
func TestUnknownValueVersionIsCorrupt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		decode func([]byte) error
		good   []byte
	}{
		{"row", func(b []byte) error { _, err := DecodeRowValue(b); return err }, RowValue(windows.Row{KeyPrefix: "sk_…", Allowed: 3, Rejected: 1, Cost: 4})},
		{"penalty", func(b []byte) error { _, err := DecodePenaltyValue(b); return err }, PenaltyValue(abuse.State{Tenant: "acme", KeyPrefix: "sk_…"})},
		{"mark", func(b []byte) error { _, err := DecodeMarkValue(b); return err }, MarkValue(windows.Mark{HWM: 7, Seen: 3})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			for _, b := range [][]byte{nil, {99, 0}} {
				err := tc.decode(b)
				if !errors.Is(err, errCorrupt) || !strings.Contains(err.Error(), tc.name+" version") {
					t.Errorf("decode %v: %v, want corrupt %s version", b, err, tc.name)
				}
			}
			if err := tc.decode(tc.good); err != nil {
				t.Errorf("own encoding: %v", err)
			}
		})
	}
}
