package state

import (
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// TestRecent: per (tenant, key_id), the minute rows starting in the span
// are summed over endpoints and partitions, for every tenant; rows before
// or after the span, and hour and day rows, are not.
func TestRecent(t *testing.T) {
	db := open(t)
	row := func(p int32, tenant, key, ep string, g windows.Granularity, start, a, r int64) Record {
		return rowRec(p, 0, windows.RowKey{Partition: p, Tenant: tenant, KeyID: key, Endpoint: ep, Gran: g, Start: start},
			&windows.Row{KeyPrefix: key[:2] + "…", Allowed: a, Rejected: r})
	}
	recs := []Record{
		row(0, "a", "k1", "/x", windows.Minute, 60, 1, 2),
		row(1, "a", "k1", "/x", windows.Minute, 60, 10, 20), // another partition
		row(0, "a", "k1", "/y", windows.Minute, 120, 100, 200),
		row(0, "a", "k1", "/x", windows.Minute, 0, 1000, 1000),   // before the span
		row(0, "a", "k1", "/x", windows.Minute, 180, 1000, 1000), // after it
		row(0, "a", "k1", "/x", windows.Hour, 0, 1000, 1000),     // another granularity
		row(2, "ab", "k2", "/x", windows.Minute, 120, 3, 4),      // a tenant whose name extends another's
		row(3, "b", "k3", "/x", windows.Day, 0, 1000, 1000),      // only a day row
		row(4, "c", "k4", "/x", windows.Minute, 60, 5, 0),
	}
	for i := range recs {
		recs[i].Offset = int64(i)
	}
	if err := db.Materialize(recs); err != nil {
		t.Fatal(err)
	}
	got, err := db.Recent(60, 180)
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(got, func(a, b KeyTotal) int { return strings.Compare(a.Tenant, b.Tenant) })
	want := []KeyTotal{
		{Tenant: "a", KeyID: "k1", KeyPrefix: "k1…", Allowed: 111, Rejected: 222},
		{Tenant: "ab", KeyID: "k2", KeyPrefix: "k2…", Allowed: 3, Rejected: 4},
		{Tenant: "c", KeyID: "k4", KeyPrefix: "k4…", Allowed: 5, Rejected: 0},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Recent = %+v\nwant %+v", got, want)
	}
}

// TestEachPenalty: every key's state of every partition.
func TestEachPenalty(t *testing.T) {
	db := open(t)
	if err := db.Materialize([]Record{
		{Partition: 4, Offset: 0, Key: PenaltyKey(4, "k1"), Value: PenaltyValue(abuse.State{Level: 2})},
		{Partition: 1, Offset: 0, Key: PenaltyKey(1, "k2"), Value: PenaltyValue(abuse.State{Level: 3})},
	}); err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := db.EachPenalty(func(p int32, id string, s abuse.State) error {
		got = append(got, id+":"+string(rune('0'+s.Level)))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, []string{"k2:3", "k1:2"}) {
		t.Fatalf("EachPenalty: %v", got)
	}
}
