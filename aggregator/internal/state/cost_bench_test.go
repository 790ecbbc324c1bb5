package state

import (
	"testing"

	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// The data set of BenchmarkRowCost: costTenants tenants of costKeys keys,
// each key with a row per endpoint per minute over costMinutes minutes,
// plus one heavy key of its own tenant with heavyMinutes minutes of rows.
// The report tenant's rows and the heavy key's rows are 10 000 each.
var costSpec = CostSpec{Tenants: 20, Keys: 100, Endpoints: 5, Minutes: 20, HeavyMinutes: 2_000, Seed: 1}

const reportRows = 10_000

// BenchmarkRowCost measures what a usage row costs in Pebble and how long a
// 10 000-row report takes. Its setup (FillCost) materializes 20 × 100 × 5 ×
// 20 minute rows (200 000) and 10 000 more of one key, as the changelog
// delivers them (closed rows, a key prefix and one rule id each, random
// 22-character key_ids), flushes and compacts everything, and reports:
//
//   - disk-B/row: the bytes of the sstables (every index a row keeps:
//     primary, by key_id, expiry) divided by the rows;
//   - logical-B/row: the bytes of the keys and values written per row
//     before Pebble's prefix compression and block compression.
//
// Then the sub-benchmarks time a report answering 10 000 rows: a tenant's
// (one range scan of the primary keys) and a key_id's (a scan of its index
// and a read per row), reporting ms/report and p99-ms. loadtest sweep
// -what pebble measures the same at other key counts.
func BenchmarkRowCost(b *testing.B) {
	db, err := Open(b.TempDir(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = db.Close() })
	data, err := db.FillCost(costSpec)
	if err != nil {
		b.Fatal(err)
	}
	b.Logf("%d rows: %d sstable bytes in %d tables, %d logical bytes", data.Rows, data.TableBytes, data.Tables, data.Logical)
	diskPerRow := float64(data.TableBytes) / float64(data.Rows)
	logicalPerRow := float64(data.Logical) / float64(data.Rows)

	queries := []struct {
		name string
		q    Query
	}{
		{"tenant", Query{Tenant: costTenant(7), Gran: windows.Minute, From: data.From, To: data.To}},
		{"key_id", Query{KeyID: data.Heavy, Gran: windows.Minute, From: data.From, To: data.To}},
	}
	for _, c := range queries {
		b.Run("report="+c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.ResetTimer()
			lat, err := db.TimeReports(c.q, b.N, reportRows)
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/report")
			b.ReportMetric(float64(lat[(len(lat)*99)/100].Microseconds())/1000, "p99-ms")
			b.ReportMetric(diskPerRow, "disk-B/row")
			b.ReportMetric(logicalPerRow, "logical-B/row")
		})
	}
}
