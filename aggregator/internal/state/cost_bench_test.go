package state

import (
	"context"
	"encoding/base64"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// The data set of BenchmarkRowCost: costTenants tenants of costKeys keys,
// each key with a row per endpoint per minute over costMinutes minutes,
// plus one heavy key of its own tenant with heavyMinutes minutes of rows.
// The report tenant's rows and the heavy key's rows are 10 000 each.
const (
	costTenants   = 20
	costKeys      = 100
	costEndpoints = 5
	costMinutes   = 20
	heavyMinutes  = 2_000
	reportRows    = 10_000
	costBatch     = 1_000
)

// BenchmarkRowCost measures what a usage row costs in Pebble and how long a
// 10 000-row report takes. Its setup materializes costTenants × costKeys ×
// costEndpoints × costMinutes minute rows (200 000) and 10 000 more of one
// key, as the changelog delivers them (closed rows, a key prefix and one
// rule id each, random 22-character key_ids), flushes and compacts
// everything, and reports:
//
//   - disk-B/row: the bytes of the sstables (every index a row keeps:
//     primary, by key_id, expiry) divided by the rows;
//   - logical-B/row: the bytes of the keys and values written per row
//     before Pebble's prefix compression and block compression.
//
// Then the sub-benchmarks time a report answering 10 000 rows: a tenant's
// (one range scan of the primary keys) and a key_id's (a scan of its index
// and a point read per row), reporting ms/report and p99-ms.
func BenchmarkRowCost(b *testing.B) {
	db, err := Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	rng := rand.New(rand.NewPCG(1, 2))
	keyID := func() string {
		var raw [16]byte
		for i := range raw {
			raw[i] = byte(rng.Uint32())
		}
		return base64.RawURLEncoding.EncodeToString(raw[:])[:22]
	}
	endpoints := []string{"GET /v1/items", "POST /v1/items", "GET /v1/items/{id}", "DELETE /v1/items/{id}", "GET /v1/search"}
	base := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC).Unix()
	var recs []Record
	var rows, logical int64
	var off int64
	put := func(tenant, kid string, minutes int) {
		for m := range minutes {
			for _, ep := range endpoints[:costEndpoints] {
				k := windows.RowKey{Partition: int32(rng.IntN(12)), Tenant: tenant, KeyID: kid, Endpoint: ep, Gran: windows.Minute, Start: base + int64(m)*60}
				r := windows.Row{KeyPrefix: "sk_live_" + kid[:4] + "…", Allowed: rng.Int64N(1000), Rejected: rng.Int64N(10), Cost: rng.Int64N(5000), Rules: []string{"per-key"}, Closed: true, Revision: 1}
				rec := Record{Partition: 0, Offset: off, Key: RowKey(k), Value: RowValue(r)}
				off++
				// Primary, by-key_id and expiry keys (a closed row has no
				// open-index entry); index values are empty.
				logical += int64(len(rec.Key)+len(rec.Value)) + int64(len(byKeyKey(k, rec.Key))+len(expiryKey(k, rec.Key)))
				rows++
				recs = append(recs, rec)
				if len(recs) == costBatch {
					if err := db.Materialize(recs); err != nil {
						b.Fatal(err)
					}
					recs = recs[:0]
				}
			}
		}
	}
	for t := range costTenants {
		tenant := fmt.Sprintf("tenant-%04d", t)
		for range costKeys {
			put(tenant, keyID(), costMinutes)
		}
	}
	heavy := keyID()
	put("tenant-heavy", heavy, heavyMinutes)
	if err := db.Materialize(recs); err != nil {
		b.Fatal(err)
	}
	if err := db.db.Flush(); err != nil {
		b.Fatal(err)
	}
	if err := db.db.Compact(context.Background(), []byte{0}, []byte{0xff}, true); err != nil {
		b.Fatal(err)
	}
	m := db.db.Metrics()
	total := m.Total()
	b.Logf("%d rows: %d sstable bytes in %d tables, %d logical bytes", rows, total.TablesSize, total.TablesCount, logical)
	diskPerRow := float64(total.TablesSize) / float64(rows)
	logicalPerRow := float64(logical) / float64(rows)

	queries := []struct {
		name string
		q    Query
	}{
		{"tenant", Query{Tenant: "tenant-0007", Gran: windows.Minute, From: base, To: base + heavyMinutes*60}},
		{"key_id", Query{KeyID: heavy, Gran: windows.Minute, From: base, To: base + heavyMinutes*60}},
	}
	for _, c := range queries {
		b.Run("report="+c.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				t0 := time.Now()
				got, cursor, err := db.Report(c.q)
				lat = append(lat, time.Since(t0))
				if err != nil || len(got) != reportRows || cursor != "" {
					b.Fatalf("report: %d rows, cursor %q, %v; want %d rows, complete", len(got), cursor, err, reportRows)
				}
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/report")
			b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(diskPerRow, "disk-B/row")
			b.ReportMetric(logicalPerRow, "logical-B/row")
		})
	}
}
