package consume_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/consume"
	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/kafkabroker/kafkatest"
	"github.com/tollgate/tollgate/internal/logtest"
	"github.com/tollgate/tollgate/internal/promtest"
	"github.com/tollgate/tollgate/internal/testwait"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

const partitions = 3

var topics = consume.Topics{Decisions: tollgatev1.TopicDecisions, Changelog: tollgatev1.TopicChangelog,
	Usage: tollgatev1.TopicUsage, Penalties: tollgatev1.TopicPenalties, Audit: tollgatev1.TopicAudit}

// proc is a processor running on its own Pebble store until stopped.
type proc struct {
	*consume.Processor
	db   *state.DB
	reg  *prometheus.Registry
	log  *logtest.Recorder
	stop func()
}

// startProc runs a processor of instance id on the brokers with its state
// in dir.
func startProc(t *testing.T, brokers []string, id, dir string) *proc {
	t.Helper()
	db, err := state.Open(dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	rec := &logtest.Recorder{}
	log := rec.Logger()
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(os.Stderr, nil)).With("test", t.Name(), "instance", id)
	}
	p := consume.New(consume.Config{Brokers: brokers, Topics: topics, InstanceID: id, Partitions: partitions,
		TxnTimeout: 5 * time.Second, SessionTimeout: 2 * time.Second, CloseEvery: 200 * time.Millisecond,
		Windows: windows.Config{Lateness: time.Second}, Log: log}, db, reg)
	ctx, cancel := context.WithCancel(context.Background())
	if err := p.Setup(ctx); err != nil {
		cancel()
		_ = db.Close()
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("processor %s: %v", id, err)
			}
		case <-time.After(30 * time.Second):
			t.Errorf("processor %s did not stop within 30s", id)
		}
		_ = db.Close()
	}
	t.Cleanup(stop)
	return &proc{Processor: p, db: db, reg: reg, log: rec, stop: stop}
}

// metric sums the samples of a metric whose labels include labels
// (name, value pairs).
func (p *proc) metric(t testing.TB, name string, labels ...string) float64 {
	t.Helper()
	return promtest.Sum(t, p.reg, name, labels...)
}

// writer produces records to the decisions topic as anyone allowed to
// write it can.
type writer struct {
	cl *kgo.Client
}

func newWriter(t *testing.T, brokers []string) *writer {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.DefaultProduceTopic(tollgatev1.TopicDecisions), kgo.ProducerBatchMaxBytes(2<<20))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return &writer{cl: cl}
}

// send produces events to their partition field's partition, in order.
func (w *writer) send(t *testing.T, evs ...*tollgatev1.DecisionEvent) {
	t.Helper()
	for _, ev := range evs {
		v, err := proto.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		r := &kgo.Record{Partition: tollgatev1.PartitionOf(ev.Tenant, partitions), Key: []byte(ev.Tenant), Value: v}
		if err := w.cl.ProduceSync(context.Background(), r).FirstErr(); err != nil {
			t.Fatal(err)
		}
	}
}

// decision is gateway gw-1's event seq of tenant acme at time at: allowed,
// cost 1.
func decision(seq uint64, at time.Time) *tollgatev1.DecisionEvent {
	return &tollgatev1.DecisionEvent{GatewayId: "gw-1", Epoch: 77, Partition: tollgatev1.PartitionOf("acme", partitions), Seq: seq,
		TimeUnixMicros: at.UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_DECISION, KeyId: "kid-1", KeyPrefix: "tg_…",
		Tenant: "acme", Endpoint: "/v1/orders", Cost: 1, RuleId: "r1", Allowed: true, Reason: "allowed"}
}

// totals is what Pebble holds for acme's minute rows.
func totals(t testing.TB, db *state.DB, from, to time.Time) (allowed, cost int64) {
	t.Helper()
	allowed, _, cost, err := db.Totals(state.Query{Tenant: "acme", Gran: windows.Minute, From: from.Unix() - 60, To: to.Unix() + 60})
	if err != nil {
		t.Fatal(err)
	}
	return allowed, cost
}

// TestPoisonStaysInQuarantine writes, between a gateway's own events,
// records with every kind of bad field and a forged sequence number, and
// checks that the usage counts exactly the gateway's events, that each bad
// record is counted by reason, that nothing stops the partition, and that
// the forged number does not silence the gateway's later events, before
// or after a restart of the aggregator.
func TestPoisonStaysInQuarantine(t *testing.T) {
	t.Parallel()
	brokers := kafkatest.StartTB(t, kafkabroker.WithPartitions(partitions), kafkabroker.WithSeedTopics(tollgatev1.TopicDecisions)).Addrs()
	dir := t.TempDir()
	a := startProc(t, brokers, "poison-a", dir)
	w := newWriter(t, brokers)
	now := time.Now()

	bad := func(seq uint64, change func(*tollgatev1.DecisionEvent)) *tollgatev1.DecisionEvent {
		ev := decision(seq, now)
		change(ev)
		return ev
	}
	var evs []*tollgatev1.DecisionEvent
	for seq := uint64(1); seq <= 5; seq++ {
		evs = append(evs, decision(seq, now))
	}
	wantInvalid := map[string]int{}
	for _, p := range []struct {
		reason string
		change func(*tollgatev1.DecisionEvent)
	}{
		{"cost", func(ev *tollgatev1.DecisionEvent) { ev.Cost = -5 }},
		{"cost", func(ev *tollgatev1.DecisionEvent) { ev.Cost = 9_000_000_000_000_000_000 }},
		{"cost", func(ev *tollgatev1.DecisionEvent) {
			ev.Kind, ev.Cost = tollgatev1.DecisionEvent_KIND_REPORT, tollgatev1.MaxCost+1
		}},
		{"time", func(ev *tollgatev1.DecisionEvent) {
			ev.TimeUnixMicros = time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC).UnixMicro()
		}},
		{"time", func(ev *tollgatev1.DecisionEvent) { ev.TimeUnixMicros = 1 }},
		{"length", func(ev *tollgatev1.DecisionEvent) { ev.Endpoint = "/" + strings.Repeat("x", 950_000) }},
		{"length", func(ev *tollgatev1.DecisionEvent) { ev.RuleId = strings.Repeat("r", tollgatev1.MaxNameLen+1) }},
		{"retry_after", func(ev *tollgatev1.DecisionEvent) { ev.RetryAfterSeconds = math.MaxInt64 }},
	} {
		evs = append(evs, bad(uint64(len(evs)+1), p.change))
		wantInvalid[p.reason]++
	}
	first := uint64(len(evs) + 1)
	// Bad identities: they touch no mark (the numbers first.. stay the
	// gateway's).
	for _, change := range []func(*tollgatev1.DecisionEvent){
		func(ev *tollgatev1.DecisionEvent) { ev.GatewayId = "" },
		func(ev *tollgatev1.DecisionEvent) { ev.Epoch = 0 },
		func(ev *tollgatev1.DecisionEvent) { ev.Seq = 0 },
		func(ev *tollgatev1.DecisionEvent) { ev.Partition++ },
		func(ev *tollgatev1.DecisionEvent) { ev.GatewayId = strings.Repeat("g", tollgatev1.MaxGatewayIDLen+1) },
	} {
		evs = append(evs, bad(first, change))
		wantInvalid["identity"]++
	}
	evs = append(evs, bad(first+5, func(ev *tollgatev1.DecisionEvent) {
		ev.Kind, ev.LastSeq = tollgatev1.DecisionEvent_KIND_EPOCH_CLOSED, first+1 // seq must be last_seq + 1
	}))
	wantInvalid["marker"]++
	// A forged sequence number far ahead, then the gateway goes on.
	evs = append(evs, decision(1_000_000, now))
	good := 5
	for seq := first; seq < first+10; seq++ {
		evs = append(evs, decision(seq, now))
		good++
	}
	w.send(t, evs...)

	check := func(p *proc, good int) {
		t.Helper()
		testwait.Eventually(t, 60*time.Second, func() error {
			allowed, cost := totals(t, p.db, now, now)
			if allowed != int64(good) || cost != int64(good) {
				return fmt.Errorf("acme counts %d allowed, cost %d; the gateway made %d decisions of cost 1", allowed, cost, good)
			}
			return nil
		})
	}
	check(a, good)
	// The metrics count a transaction after its commit, so they may trail
	// the totals just read by a moment.
	testwait.Eventually(t, 30*time.Second, func() error {
		var errs []error
		for reason, n := range wantInvalid {
			if got := a.metric(t, "tollgate_aggregator_events_invalid_total", "reason", reason); got != float64(n) {
				errs = append(errs, fmt.Errorf("invalid{reason=%q} = %v, want %d", reason, got, n))
			}
		}
		if got := a.metric(t, "tollgate_aggregator_sequence_anomalies_total", "kind", "held_discarded"); got != 1 {
			errs = append(errs, fmt.Errorf("held_discarded = %v, want 1 (the forged number)", got))
		}
		if n := a.log.Count("WARN decision events refused or held"); !testing.Verbose() && n < 1 {
			errs = append(errs, errors.New("the refusals were not logged yet"))
		}
		return errors.Join(errs...)
	})
	if got := a.metric(t, "tollgate_aggregator_events_missing_total"); got != 0 {
		t.Errorf("missing = %v: the refused records used their numbers, the forged one was held", got)
	}
	// Logged once per interval with the counts, not once per record.
	if n := a.log.Count("WARN decision events refused or held"); !testing.Verbose() && (n < 1 || n > 2) {
		t.Errorf("the refusals were logged %d times, want once (or twice: two intervals)", n)
	}

	// The forged number again, last: held when the aggregator restarts (on
	// a new store, rebuilt from the changelog), and the gateway's next
	// events still count.
	next := first + 10
	w.send(t, decision(2_000_000, now))
	testwait.Eventually(t, 30*time.Second, func() error {
		if n := a.metric(t, "tollgate_aggregator_events_total", "result", "held"); n != 2 {
			return fmt.Errorf("%v events held, want 2", n)
		}
		return nil
	})
	a.stop()
	b := startProc(t, brokers, "poison-b", t.TempDir())
	for seq := next; seq < next+5; seq++ {
		w.send(t, decision(seq, now))
		good++
	}
	check(b, good)
	if got := b.metric(t, "tollgate_aggregator_events_total", "result", "duplicate"); got != 0 {
		t.Errorf("%v of the gateway's events taken for duplicates", got)
	}
}

// TestOversizedRollupNeverBlocksTheTick closes a window whose usage record
// is larger than the usage topic takes — a 950 KB endpoint stored by an
// earlier build (1.9 MB of rollup), or a long valid endpoint on a topic with
// a small max.message.bytes — next to ordinary windows: every window is
// published (the big one cut, with truncated set), transactions commit, and
// later windows keep being published.
func TestOversizedRollupNeverBlocksTheTick(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		maxBytes int  // usage topic's max.message.bytes; 0: the default
		lowered  bool // set to maxBytes only once the processor runs
		endpoint string
		seeded   bool // the row is in the changelog already (an earlier build counted it)
	}{
		{name: "950 KB endpoint from an earlier build", endpoint: "/" + strings.Repeat("e", 950_000), seeded: true},
		// Random letters: the broker measures the compressed batch.
		{name: "small max.message.bytes", maxBytes: 2000, endpoint: "/" + randomLetters(tollgatev1.MaxEndpointLen-1)},
		{name: "max.message.bytes lowered while running", maxBytes: 2000, lowered: true, endpoint: "/" + randomLetters(tollgatev1.MaxEndpointLen-1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			brokers := kafkatest.StartTB(t, kafkabroker.WithPartitions(partitions), kafkabroker.WithSeedTopics(tollgatev1.TopicDecisions)).Addrs()
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RecordPartitioner(kgo.ManualPartitioner()),
				kgo.ProducerBatchMaxBytes(2<<20))
			if err != nil {
				t.Fatal(err)
			}
			defer cl.Close()
			adm := kadm.NewClient(cl)
			ctx := context.Background()
			compact := "compact"
			if _, err := adm.CreateTopic(ctx, partitions, -1, map[string]*string{"cleanup.policy": &compact}, tollgatev1.TopicChangelog); err != nil {
				t.Fatal(err)
			}
			var cfg map[string]*string
			v := fmt.Sprint(tc.maxBytes)
			if tc.maxBytes > 0 && !tc.lowered {
				cfg = map[string]*string{"max.message.bytes": &v}
			}
			if _, err := adm.CreateTopic(ctx, partitions, -1, cfg, tollgatev1.TopicUsage); err != nil {
				t.Fatal(err)
			}
			past := time.Now().Add(-5 * time.Minute).Truncate(time.Minute)
			q := tollgatev1.PartitionOf("acme", partitions)
			if tc.seeded {
				for _, g := range windows.All {
					k := windows.RowKey{Partition: q, Tenant: "acme", KeyID: "kid-big", Endpoint: tc.endpoint, Gran: g,
						Start: past.Unix() - past.Unix()%g.Seconds()}
					r := &kgo.Record{Topic: tollgatev1.TopicChangelog, Partition: q, Key: state.RowKey(k),
						Value: state.RowValue(windows.Row{Allowed: 7, Cost: 7})}
					if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
						t.Fatal(err)
					}
				}
			}
			p := startProc(t, brokers, "big", t.TempDir())
			if tc.lowered {
				testwait.Eventually(t, 30*time.Second, func() error {
					if !p.Ready() {
						return fmt.Errorf("not ready")
					}
					return nil
				})
				resp, err := adm.AlterTopicConfigs(ctx, []kadm.AlterConfig{{Op: kadm.SetConfig, Name: "max.message.bytes", Value: &v}},
					tollgatev1.TopicUsage)
				if err == nil {
					_, err = resp.On(tollgatev1.TopicUsage, nil)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			w := newWriter(t, brokers)
			for seq := uint64(1); seq <= 3; seq++ {
				ev := decision(seq, past)
				if seq == 2 && !tc.seeded {
					ev.KeyId, ev.Endpoint = "kid-big", tc.endpoint
				}
				w.send(t, ev)
			}
			rd, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.ConsumeTopics(tollgatev1.TopicUsage),
				kgo.FetchIsolationLevel(kgo.ReadCommitted()), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Close()
			got := map[string]*tollgatev1.UsageRollup{} // by key_id and granularity
			poll := func(want func() error) {
				t.Helper()
				testwait.Eventually(t, 60*time.Second, func() error {
					pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
					defer cancel()
					rd.PollFetches(pctx).EachRecord(func(r *kgo.Record) {
						var u tollgatev1.UsageRollup
						if err := proto.Unmarshal(r.Value, &u); err != nil {
							t.Errorf("usage record: %v", err)
							return
						}
						if size := len(r.Key) + len(r.Value); tc.maxBytes > 0 && !tc.lowered && size > tc.maxBytes {
							t.Errorf("usage record of %d bytes on a topic that takes %d", size, tc.maxBytes)
						}
						got[fmt.Sprint(u.KeyId, u.Granularity)] = &u
					})
					return want()
				})
			}
			minute := tollgatev1.Granularity_GRANULARITY_MINUTE
			poll(func() error {
				small, big := got[fmt.Sprint("kid-1", minute)], got[fmt.Sprint("kid-big", minute)]
				if small == nil || big == nil {
					return fmt.Errorf("minute rollups published: ordinary %v, oversized %v", small != nil, big != nil)
				}
				return nil
			})
			big := got[fmt.Sprint("kid-big", minute)]
			if !big.Truncated || !strings.Contains(big.Endpoint, tollgatev1.TruncationMark+"#") || len(big.Endpoint) >= len(tc.endpoint) {
				t.Errorf("oversized rollup: truncated %v, endpoint of %d bytes ending %q", big.Truncated, len(big.Endpoint),
					big.Endpoint[max(0, len(big.Endpoint)-24):])
			}
			if want := int64(1); tc.seeded {
				want = 7
				if big.Allowed != want {
					t.Errorf("oversized rollup counts %d, want %d", big.Allowed, want)
				}
			} else if big.Allowed != want {
				t.Errorf("oversized rollup counts %d, want %d", big.Allowed, want)
			}
			testwait.Eventually(t, 10*time.Second, func() error {
				if n := p.metric(t, "tollgate_aggregator_rollups_oversized_total", "action", "truncated"); n == 0 {
					return fmt.Errorf("no truncation counted")
				}
				return nil
			})
			// Later windows are published too: the tick goes on.
			later := past.Add(2 * time.Minute)
			w.send(t, decision(4, later))
			poll(func() error {
				if u := got[fmt.Sprint("kid-1", minute)]; u.WindowStartUnix != later.Unix() {
					return fmt.Errorf("latest minute rollup of kid-1 starts %d, want %d", u.WindowStartUnix, later.Unix())
				}
				return nil
			})
			if n := p.metric(t, "tollgate_aggregator_transactions_total", "result", "error"); n != 0 {
				t.Errorf("%v transactions failed", n)
			}
		})
	}
}

// randomLetters returns n letters that compress poorly.
func randomLetters(n int) string {
	rng := rand.New(rand.NewPCG(1, 2))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte('a' + rng.IntN(26))
	}
	return string(b)
}
