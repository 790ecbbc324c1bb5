// Package costs measures how the aggregator's costs grow with the number
// of distinct keys: the CPU of counting a decision event (decode, bounds,
// windows, detectors; no Kafka) and the Pebble bytes of a usage row with
// the latency of a 10 000-row report beside them. loadtest's key-count
// sweep (loadtest sweep -what aggregator,pebble) calls it; the
// aggregator's own benchmarks run the same code at one size.
package costs

import (
	"fmt"
	"runtime"
	"syscall"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/consume"
	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// ApplyResult is what Apply measured.
type ApplyResult struct {
	Keys, Events int
	// CPU is the process's user + system CPU over the run (the
	// collector's work included); Wall its wall time.
	CPU, Wall time.Duration
}

// EventsPerCPUSecond is the events counted per second of CPU: the
// aggregator's events/s per core, without Kafka.
func (r ApplyResult) EventsPerCPUSecond() float64 {
	if r.CPU <= 0 {
		return 0
	}
	return float64(r.Events) / r.CPU.Seconds()
}

// Apply counts events decision events over keys distinct key_ids (event
// i has key i mod keys: with keys ≥ events every event is a different
// key), with the abuse detectors, and measures the process's CPU. Run it
// with nothing else busy in the process.
func Apply(keys, events int) (ApplyResult, error) {
	a, err := consume.NewApplyBench(keys, events)
	if err != nil {
		return ApplyResult{}, err
	}
	runtime.GC()
	cpu0, err := processCPU()
	if err != nil {
		return ApplyResult{}, err
	}
	t0 := time.Now()
	if err := a.Run(events, true); err != nil {
		return ApplyResult{}, err
	}
	wall := time.Since(t0)
	cpu1, err := processCPU()
	if err != nil {
		return ApplyResult{}, err
	}
	return ApplyResult{Keys: keys, Events: events, CPU: cpu1 - cpu0, Wall: wall}, nil
}

// processCPU is the process's user + system CPU so far.
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("costs: getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}

// ReportRows is how many rows the timed report answers.
const ReportRows = 10_000

// tenantKeys is how many keys each tenant of RowCost's data set has.
const tenantKeys = 1_000

// RowResult is what RowCost measured.
type RowResult struct {
	// Keys is the number of distinct keys, each with one minute row on
	// one endpoint; Rows is Keys.
	Keys int
	Rows int64
	// DiskPerRow is the compacted sstable bytes per row; LogicalPerRow
	// the bytes of the keys and values written per row (with the key_id
	// and expiry index keys) before compression.
	DiskPerRow, LogicalPerRow float64
	// Reports holds the latency of each report of ReportRows rows by
	// key_id, sorted.
	Reports []time.Duration
}

// P99 is the 99th percentile of the reports' latency (the slowest of
// fewer than 100).
func (r RowResult) P99() time.Duration {
	if len(r.Reports) == 0 {
		return 0
	}
	return r.Reports[len(r.Reports)*99/100]
}

// Mean is the reports' mean latency.
func (r RowResult) Mean() time.Duration {
	if len(r.Reports) == 0 {
		return 0
	}
	var sum time.Duration
	for _, d := range r.Reports {
		sum += d
	}
	return sum / time.Duration(len(r.Reports))
}

// RowCost opens a Pebble store in dir (empty; the caller removes it),
// materializes one closed minute row for each of keys distinct keys (on
// one endpoint, tenants of 1 000 keys), compacts and measures the bytes
// per row; then adds one key with ReportRows minute rows, compacts again
// and times reports of that key's rows by key_id.
func RowCost(dir string, keys, reports int) (RowResult, error) {
	if keys < 1 || reports < 1 {
		return RowResult{}, fmt.Errorf("costs: row cost of %d keys, %d reports: both must be ≥ 1", keys, reports)
	}
	db, err := state.Open(dir, nil)
	if err != nil {
		return RowResult{}, fmt.Errorf("costs: open state: %w", err)
	}
	defer db.Close()
	spec := state.CostSpec{Tenants: keys / tenantKeys, Keys: tenantKeys, Endpoints: 1, Minutes: 1, Seed: 1}
	if keys < tenantKeys {
		spec.Tenants, spec.Keys = 1, keys
	}
	data, err := db.FillCost(spec)
	if err != nil {
		return RowResult{}, err
	}
	r := RowResult{Keys: keys, Rows: data.Rows,
		DiskPerRow: float64(data.TableBytes) / float64(data.Rows), LogicalPerRow: float64(data.Logical) / float64(data.Rows)}
	heavy, err := db.FillCost(state.CostSpec{Endpoints: 1, HeavyMinutes: ReportRows, Seed: 2, FirstOffset: data.NextOffset})
	if err != nil {
		return r, err
	}
	q := state.Query{KeyID: heavy.Heavy, Gran: windows.Minute, From: heavy.From, To: heavy.To}
	if r.Reports, err = db.TimeReports(q, reports, ReportRows); err != nil {
		return r, err
	}
	return r, nil
}
