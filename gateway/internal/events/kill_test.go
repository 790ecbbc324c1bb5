package events_test

import (
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/internal/testnet"
)

// The "record" helper's producer settings.
const (
	killFlushInterval = 100 * time.Millisecond
	killMemoryBytes   = 1 << 20
	// minEventBytes is less than any test decision's encoding (about 130
	// bytes) with its frame, so killMemoryBytes/minEventBytes bounds the
	// events the memory buffer can hold.
	minEventBytes = 100
)

// TestSIGKILLLosesOnlyTheMemoryTail SIGKILLs a process that records
// decisions, with Kafka up and with Kafka down, then restarts a producer on
// its spool: what the killed process recorded more than FlushInterval
// (plus a slack for a loaded machine) before its death arrives; the loss
// is at most what the memory buffer holds; and the EpochClosed marker makes
// the aggregator count the lost tail as missing, exactly: recorded ≤
// applied + missing ≤ recorded + what it recorded after its last report,
// and missing > 0 when something was lost.
func TestSIGKILLLosesOnlyTheMemoryTail(t *testing.T) {
	t.Parallel()
	const slack = 2 * time.Second
	for _, tc := range []struct {
		name    string
		kafkaUp bool
	}{{"kafka up", true}, {"kafka down", false}} {
		t.Run(tc.name, func(t *testing.T) {
			port := testnet.FreePort(t)
			brokers := []string{"127.0.0.1:" + strconv.Itoa(port)}
			if tc.kafkaUp {
				startKafka(t, port, "")
			}
			dir := t.TempDir()
			ch := startChild(t, "record", envBrokers+"="+brokers[0], envSpool+"="+dir)
			epoch, err := strconv.ParseUint(ch.line(t, "epoch "), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			type point struct {
				n  int
				at time.Time
			}
			var history []point
			for len(history) == 0 || history[len(history)-1].n < 80_000 {
				n, at := parseRecorded(t, ch.line(t, "recorded "))
				history = append(history, point{n, at})
			}
			if err := ch.cmd.Process.Kill(); err != nil { // SIGKILL
				t.Fatal(err)
			}
			killedAt := time.Now()
			for ch.out.Scan() { // the lines it printed before it died (Wait would close the pipe)
				if s, ok := strings.CutPrefix(ch.out.Text(), "recorded "); ok {
					n, at := parseRecorded(t, s)
					history = append(history, point{n, at})
				}
			}
			_ = ch.cmd.Wait()
			recorded := history[len(history)-1].n
			cutoff := 0 // recorded more than FlushInterval + slack before the kill
			for _, h := range history {
				if h.at.Before(killedAt.Add(-killFlushInterval - slack)) {
					cutoff = h.n
				}
			}

			if !tc.kafkaUp {
				startKafka(t, port, "")
			}
			p := start(t, testConfig(t, brokers, dir))
			if p.Epoch() == epoch {
				t.Fatal("the restarted producer reused the killed one's epoch")
			}
			p.waitDrained(t, 60*time.Second)
			p.shutdown(t)
			got := aggregate(t, readAll(t, brokers))
			applied := got.byEpoch[epoch]
			var missing, top uint64
			closed := 0
			for s, m := range got.marks {
				if s.epoch == epoch {
					missing += m.missing
					top = max(top, m.last)
					if m.closed {
						closed++
					}
				}
			}
			lost := recorded - applied
			t.Logf("killed after recording %d: %d arrived (%d duplicates), lost %d (~%v of recording), aggregator counts %d missing, %d partitions closed",
				recorded, applied, got.duplicates, lost, time.Duration(lost)*time.Millisecond/50, missing, closed)
			// A marker naming fewer numbers than were used would be a
			// duplicate and leave its partition open: the reservations
			// (extended past the first 10,000 here) were durable first.
			if closed != partitions {
				t.Errorf("%d of %d partitions of the killed epoch closed", closed, partitions)
			}
			if top <= 10_000 {
				t.Errorf("the markers name %d as the highest sequence number used: the test did not cross a reservation", top)
			}
			if uint64(applied)+missing < uint64(recorded) {
				t.Errorf("applied %d + missing %d < recorded %d: a loss went uncounted", applied, missing, recorded)
			}
			// The marker names the last number used (the sequence ledger):
			// nothing that was never recorded counts as missing.
			if uint64(applied)+missing > uint64(recorded+recordBatch) {
				t.Errorf("applied %d + missing %d > recorded %d + %d: numbers never used counted as lost", applied, missing, recorded, recordBatch)
			}
			if lost > 0 && missing == 0 {
				t.Errorf("%d events lost and none counted missing", lost)
			}
			if applied < cutoff {
				t.Errorf("only %d events arrived; %d were recorded more than %v before the kill", applied, cutoff, killFlushInterval+slack)
			}
			// What exceeds the memory buffer was dropped while the spool's
			// disk lagged (a loaded machine): counted, and in missing above;
			// the guarantee is the cutoff, checked above.
			if bound := killMemoryBytes / minEventBytes; lost > bound {
				t.Logf("lost %d events, more than the memory buffer holds (%d): the rest were dropped while the spool lagged", lost, bound)
			}
		})
	}
}
