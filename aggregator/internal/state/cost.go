package state

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// CostSpec describes a data set of closed minute usage rows for measuring
// what a row costs: Tenants tenants of Keys keys each, every key with a
// row per endpoint (the first Endpoints of five) per minute over Minutes
// minutes, plus one heavy key of its own tenant with HeavyMinutes minutes
// of rows on every endpoint. Key ids are random 22-character strings drawn
// from Seed; every row has a key prefix and one rule id.
type CostSpec struct {
	Tenants, Keys, Endpoints, Minutes int
	HeavyMinutes                      int
	Seed                              uint64
	// FirstOffset is the changelog offset of the first row: a second
	// fill of the same store starts at the first's NextOffset (the
	// materializer skips offsets it has applied).
	FirstOffset int64
}

// CostData is what FillCost wrote.
type CostData struct {
	// Rows is how many rows were written; Logical the bytes of their keys
	// and values (with the key_id and expiry index keys) before Pebble's
	// prefix and block compression.
	Rows, Logical int64
	// TableBytes and Tables are the sstables' size and count after the
	// flush and the compaction.
	TableBytes, Tables int64
	// FirstTenant is the first tenant's name; Heavy the heavy key's
	// key_id and HeavyTenant its tenant.
	FirstTenant, Heavy, HeavyTenant string
	// From and To bound every row's minute (To exclusive).
	From, To int64
	// NextOffset follows the last row's changelog offset.
	NextOffset int64
}

// costBatch is how many records FillCost materializes at a time.
const costBatch = 1_000

// costEndpoints are the endpoints FillCost writes rows for.
var costEndpoints = []string{"GET /v1/items", "POST /v1/items", "GET /v1/items/{id}", "DELETE /v1/items/{id}", "GET /v1/search"}

// FillCost materializes spec's rows into d as the changelog delivers them
// (closed rows), then flushes and compacts the whole store so that the
// sstables hold everything once.
func (d *DB) FillCost(spec CostSpec) (CostData, error) {
	if spec.Tenants < 0 || spec.Keys < 0 || spec.Minutes < 0 || spec.HeavyMinutes < 0 ||
		spec.Endpoints < 1 || spec.Endpoints > len(costEndpoints) {
		return CostData{}, fmt.Errorf("state: cost data %+v: counts must be ≥ 0 and endpoints 1–%d", spec, len(costEndpoints))
	}
	rng := rand.New(rand.NewPCG(spec.Seed, spec.Seed^0x2545f4914f6cdd1d))
	keyID := func() string {
		var raw [16]byte
		for i := range raw {
			raw[i] = byte(rng.Uint32())
		}
		return base64.RawURLEncoding.EncodeToString(raw[:])[:22]
	}
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Unix()
	out := CostData{FirstTenant: costTenant(0), HeavyTenant: "tenant-heavy", From: base,
		To: base + int64(max(spec.Minutes, spec.HeavyMinutes))*60}
	recs := make([]Record, 0, costBatch)
	off := spec.FirstOffset
	put := func(tenant, kid string, minutes int) error {
		for m := range minutes {
			for _, ep := range costEndpoints[:spec.Endpoints] {
				k := windows.RowKey{Partition: int32(rng.IntN(12)), Tenant: tenant, KeyID: kid, Endpoint: ep, Gran: windows.Minute, Start: base + int64(m)*60}
				r := windows.Row{KeyPrefix: "sk_live_" + kid[:4] + "…", Allowed: rng.Int64N(1000), Rejected: rng.Int64N(10), Cost: rng.Int64N(5000), Rules: []string{"per-key"}, Closed: true, Revision: 1}
				rec := Record{Partition: 0, Offset: off, Key: RowKey(k), Value: RowValue(r)}
				off++
				// Primary, by-key_id and expiry keys (a closed row has no
				// open-index entry); index values are empty.
				out.Logical += int64(len(rec.Key)+len(rec.Value)) + int64(len(byKeyKey(k, rec.Key))+len(expiryKey(k, rec.Key)))
				out.Rows++
				recs = append(recs, rec)
				if len(recs) == costBatch {
					if err := d.Materialize(recs); err != nil {
						return err
					}
					recs = recs[:0]
				}
			}
		}
		return nil
	}
	for t := range spec.Tenants {
		tenant := costTenant(t)
		for range spec.Keys {
			if err := put(tenant, keyID(), spec.Minutes); err != nil {
				return out, err
			}
		}
	}
	if spec.HeavyMinutes > 0 {
		out.Heavy = keyID()
		if err := put(out.HeavyTenant, out.Heavy, spec.HeavyMinutes); err != nil {
			return out, err
		}
	}
	if err := d.Materialize(recs); err != nil {
		return out, err
	}
	out.NextOffset = off
	if err := d.db.Flush(); err != nil {
		return out, fmt.Errorf("state: flush: %w", err)
	}
	if err := d.db.Compact(context.Background(), []byte{0}, []byte{0xff}, true); err != nil {
		return out, fmt.Errorf("state: compact: %w", err)
	}
	total := d.db.Metrics().Total()
	out.TableBytes, out.Tables = total.TablesSize, total.TablesCount
	return out, nil
}

// costTenant names tenant t of a cost data set.
func costTenant(t int) string { return fmt.Sprintf("tenant-%04d", t) }

// ErrReportRows is returned (wrapped) by TimeReports when a report does not
// answer the rows it should.
var ErrReportRows = errors.New("state: report answered the wrong rows")

// TimeReports runs q n times, checking that each answers want rows
// complete, and returns each one's latency, sorted.
func (d *DB) TimeReports(q Query, n, want int) ([]time.Duration, error) {
	lat := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		got, cursor, err := d.Report(q)
		lat = append(lat, time.Since(t0))
		if err != nil {
			return lat, fmt.Errorf("state: report: %w", err)
		}
		if len(got) != want || cursor != "" {
			return lat, fmt.Errorf("%w: %d rows, cursor %q; want %d rows, complete", ErrReportRows, len(got), cursor, want)
		}
	}
	slices.Sort(lat)
	return lat, nil
}
