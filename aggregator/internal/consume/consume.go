// Package consume is the aggregator's exactly-once processing of the
// decisions topic (docs/aggregator.md): topic setup, the transactional
// loop, and the Kafka clients that feed the state's materializer.
//
// Shape (Kafka Streams' state store, built on franz-go): a
// GroupTransactSession consumes tollgate.decisions.v1 in a consumer group.
// Each transaction (a poll, or the polls of a backlog up to CommitInterval)
// is one Kafka transaction: the events update the usage rows of
// their partition's windows.Table inside a windows.Txn, and the decisions
// counted (never duplicates) feed the partition's abuse.Table inside an
// abuse.Txn, as do the lift commands the operator API writes into the
// topic; the rows, marks and penalty states the transaction changed are
// produced, as absolute values, to the compacted changelog partition with
// the same number as the decisions partition, closed windows to
// tollgate.usage.v1, the ladder's steps to tollgate.penalties.v1 and
// tollgate.audit.v1, and the consumed offsets are committed in the same
// transaction. Only once it commits do the changes reach the tables (an
// abort — a rebalance — discards them and the session rewinds to the
// committed offsets). The steps reach NATS KV through the outbox (package
// outbox), which reads the penalties topic read_committed.
//
// The loop (loop.go) reads poll → apply → commit around a batch, the work
// of one transaction (batch.go); it is owned by one goroutine and takes no
// lock.
//
// The materializer (package state, which owns Pebble) reads every
// changelog partition through a plain read_committed consumer this package
// creates, and writes each batch with its offsets. A partition's table is
// built, when its first record arrives after an assignment, from Pebble
// once the materializer has reached the partition's last stable offset —
// so it reflects every committed transaction of the previous owner,
// whether that owner stopped cleanly, crashed or is gone for good.
//
// Run starts two goroutines (the materializer and the processing loop)
// and returns after both have stopped.
package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/internal/kafkalog"
)

// Topics names the topics the processor uses.
type Topics struct {
	Decisions string
	Changelog string
	Usage     string
	// Penalties and Audit are created with the others (audit retained
	// forever).
	Penalties string
	Audit     string
}

// Config configures a Processor.
type Config struct {
	Brokers []string
	Topics  Topics
	// Group is the consumer group (default tollgate-aggregator).
	Group string
	// InstanceID is unique per instance; the transactional id derives
	// from it.
	InstanceID string
	// Partitions is the partition count of the topics the processor
	// creates when they are missing (default 6). Existing topics keep
	// theirs; the changelog is created with the decisions topic's count.
	Partitions int32
	// TxnTimeout bounds how long a dead instance's open transaction
	// stalls read_committed readers (default 10s).
	TxnTimeout time.Duration
	// SessionTimeout is how long the group waits for a silent member
	// before giving its partitions away (default 10s).
	SessionTimeout time.Duration
	// MaxPoll bounds the records of one poll (default 20000).
	MaxPoll int
	// CommitInterval is the longest a transaction folds in polls of a
	// backlog before it commits (default 500ms); a lull commits at once.
	CommitInterval time.Duration
	// MaxTxnRecords bounds the events of one transaction (default 200000).
	MaxTxnRecords int
	// CloseEvery is how often windows due are closed and memory evicted
	// (default 1s); expired rows are deleted every 60 CloseEvery.
	CloseEvery time.Duration
	// StallAfter is how long polled events may wait for their
	// transaction to commit before Health reports the processor stalled
	// (default twice TxnTimeout: a whole transaction lifetime has passed
	// without a commit).
	StallAfter time.Duration
	Windows    windows.Config
	// Abuse configures the detectors and the penalty ladder.
	Abuse abuse.Config
	Log   *slog.Logger
	// Now is the wall clock (default time.Now).
	Now func() time.Time
	// Observe, if set, is called with every decision applied to the
	// usage windows (once per event, replays excluded), on the consuming
	// goroutine: it must not block. The regions agent counts demand from
	// it. The event is reused after the call.
	Observe func(ev *windows.Event)
}

func (c *Config) setDefaults() {
	configs.Default(&c.Group, "tollgate-aggregator")
	configs.DefaultPositive(&c.Partitions, 6)
	configs.DefaultPositive(&c.TxnTimeout, 10*time.Second)
	configs.DefaultPositive(&c.SessionTimeout, 10*time.Second)
	configs.DefaultPositive(&c.MaxPoll, 20_000)
	configs.DefaultPositive(&c.CommitInterval, 500*time.Millisecond)
	configs.DefaultPositive(&c.MaxTxnRecords, 200_000)
	configs.DefaultPositive(&c.CloseEvery, time.Second)
	configs.DefaultPositive(&c.StallAfter, 2*c.TxnTimeout)
	configs.Default(&c.Log, slog.New(slog.DiscardHandler))
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Windows.SetDefaults()
	c.Abuse.SetDefaults()
}

// Processor runs the aggregation. Create it with New, then call Run once.
type Processor struct {
	cfg Config
	db  *state.DB
	log *slog.Logger
	m   *metrics

	mat *state.Materializer // the changelog's tail into Pebble

	mu           sync.Mutex
	memberEvents []memberEvent
	owned        map[int32]bool
	life         life // lifecycle and readiness (lifecycle.go)
	lm           *lifeMetrics
	lastMember   string // the last session's member id; owned by the processing loop

	parts map[int32]bool // changelog partitions, set by Setup

	// Owned by the processing loop.
	rollupLimit int       // the largest usage record, with its overhead
	poison      poisonLog // refused and held events, logged once per interval
}

type memberEvent struct {
	partitions []int32
	assigned   bool
}

// New returns a processor over db, registering its metrics with reg.
func New(cfg Config, db *state.DB, reg prometheus.Registerer) *Processor {
	cfg.setDefaults()
	p := &Processor{cfg: cfg, db: db, log: cfg.Log, m: newMetrics(reg), owned: map[int32]bool{}, lm: newLifeMetrics(reg)}
	p.mat = state.NewMaterializer(db, cfg.Log, p.m.materialized)
	p.setStage(StageStarting, nil)
	p.markRestore()
	return p
}

// Ready reports whether the materializer has caught up with the changelog
// as it was when Run started: reports are complete from then on.
func (p *Processor) Ready() bool { return p.mat.Ready() }

// Owned returns the decisions partitions this instance processes now.
func (p *Processor) Owned() []int32 {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]int32, 0, len(p.owned))
	for q := range p.owned {
		out = append(out, q)
	}
	return out
}

// Setup creates the topics that are missing and checks the store's
// identity against the Kafka cluster and changelog (wiping a store made
// against another). Call it, once, before Run and before anything else
// writes to the store: it may delete everything. It waits for Kafka for as
// long as ctx lasts (Health says why meanwhile).
func (p *Processor) Setup(ctx context.Context) error {
	admin, err := kgo.NewClient(p.baseOpts()...)
	if err != nil {
		return fmt.Errorf("consume: kafka client: %w", err)
	}
	defer admin.Close()
	p.parts, err = p.setup(ctx, kadm.NewClient(admin))
	return err
}

func (p *Processor) baseOpts() []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(p.cfg.Brokers...),
		kgo.WithLogger(kafkalog.New(p.log)),
		// Metadata answers are cached this long: topics created a moment
		// ago must show up (the default is 5s).
		kgo.MetadataMinAge(250 * time.Millisecond),
	}
}

// Run materializes and processes until ctx is done (Setup first). It
// returns nil after a shutdown asked for by ctx.
func (p *Processor) Run(ctx context.Context) error {
	if p.parts == nil {
		return errors.New("consume: Run before Setup")
	}
	base := p.baseOpts()
	admin, err := kgo.NewClient(base...)
	if err != nil {
		return fmt.Errorf("consume: kafka client: %w", err)
	}
	defer admin.Close()
	adm := kadm.NewClient(admin)
	resume, err := p.mat.Resume(p.parts)
	if err != nil {
		return err
	}
	offsets := map[int32]kgo.Offset{}
	for q, off := range resume {
		offsets[q] = kgo.NewOffset().At(off)
	}
	p.markRestore()
	defer p.setStage(StageStopped, nil)
	var start map[int32]int64
	for attempt := 0; ; attempt++ {
		if start, err = p.stableOffsets(ctx, adm); err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if attempt%30 == 0 {
			p.log.Warn("kafka unreachable; retrying", slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	mat, err := kgo.NewClient(append(base,
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{p.cfg.Topics.Changelog: offsets}),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)...)
	if err != nil {
		return fmt.Errorf("consume: changelog client: %w", err)
	}
	defer mat.Close()

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	var matErr, procErr error
	wg.Go(func() {
		if matErr = p.mat.Run(ctx, mat, admin, p.cfg.Topics.Changelog, start, p.markRestore); matErr != nil {
			cancel()
		}
	})
	wg.Go(func() {
		if procErr = p.process(ctx, base, adm); procErr != nil {
			cancel()
		}
	})
	wg.Wait()
	return errors.Join(matErr, procErr)
}

// member queues an assignment or revocation for the loop.
func (p *Processor) member(parts []int32, assigned bool) {
	if len(parts) == 0 {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.memberEvents = append(p.memberEvents, memberEvent{partitions: parts, assigned: assigned})
	for _, q := range parts {
		if assigned {
			p.owned[q] = true
		} else {
			delete(p.owned, q)
			// The new owner reports this partition's lag; a value left
			// here would be summed with its, and stay after it caught up.
			p.m.lag.DeleteLabelValues(fmt.Sprint(q))
		}
	}
	p.m.owned.Set(float64(len(p.owned)))
}

// applyMembership drops the tables of revoked partitions, so a partition
// assigned again is rebuilt from what its owner in between committed. It
// reports whether anything was revoked.
func (p *Processor) applyMembership(tables map[int32]*part) (revoked bool) {
	p.mu.Lock()
	evs := p.memberEvents
	p.memberEvents = nil
	p.mu.Unlock()
	for _, e := range evs {
		if e.assigned {
			p.log.Info("partitions assigned", slog.Any("partitions", e.partitions))
			continue
		}
		p.log.Info("partitions revoked", slog.Any("partitions", e.partitions))
		revoked = true
		for _, q := range e.partitions {
			delete(tables, q)
		}
	}
	return revoked
}

// restore builds partition q's table from Pebble once the materializer
// holds the changelog up to its last stable offset.
func (p *Processor) restore(ctx context.Context, adm *kadm.Client, q int32) (*part, error) {
	start := time.Now()
	// Kafka may be away (an outage, a broker restart): wait for it rather
	// than stop; a rebalance meanwhile aborts the transaction anyway.
	var o kadm.ListedOffset
	for attempt := 0; ; attempt++ {
		listed, err := adm.ListCommittedOffsets(ctx, p.cfg.Topics.Changelog)
		if err == nil {
			var ok bool
			if o, ok = listed.Lookup(p.cfg.Topics.Changelog, q); ok && o.Err == nil {
				break
			}
			err = fmt.Errorf("partition %d: %v", q, o.Err)
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if attempt%20 == 0 {
			p.log.Warn("changelog offsets unavailable; retrying", slog.Int("partition", int(q)), slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(250 * time.Millisecond):
		}
	}
	st, err := p.mat.Restore(ctx, q, o.Offset)
	if err != nil {
		return nil, err
	}
	p.log.Info("partition state restored", slog.Int("partition", int(q)), slog.Int("open_rows", len(st.Open)),
		slog.Int("sources", len(st.Marks)), slog.Int("penalty_keys", len(st.Penalties)), slog.Int64("changelog_offset", o.Offset),
		slog.Duration("took", time.Since(start)))
	p.m.restores.Inc()
	return &part{win: windows.NewTable(p.cfg.Windows, q, p.db, st.Open, st.Marks), pen: abuse.NewTable(p.cfg.Abuse, q, st.Penalties)}, nil
}
