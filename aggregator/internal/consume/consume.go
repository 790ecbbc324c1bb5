// Package consume is the aggregator's Kafka side: the exactly-once
// processing loop over the decisions topic and the materializer that keeps
// Pebble in step with the changelog (docs/aggregator.md).
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
// The materializer is a plain read_committed consumer of every changelog
// partition; it is the only writer of Pebble and writes each batch with its
// offsets. A partition's table is built, when its first record arrives
// after an assignment, from Pebble once the materializer has reached the
// partition's last stable offset — so it reflects every committed
// transaction of the previous owner, whether that owner stopped cleanly,
// crashed or is gone for good.
//
// Run starts two goroutines (the materializer and the processing loop)
// and returns after both have stopped.
package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
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
}

func (c *Config) setDefaults() {
	if c.Group == "" {
		c.Group = "tollgate-aggregator"
	}
	if c.Partitions <= 0 {
		c.Partitions = 6
	}
	if c.TxnTimeout <= 0 {
		c.TxnTimeout = 10 * time.Second
	}
	if c.SessionTimeout <= 0 {
		c.SessionTimeout = 10 * time.Second
	}
	if c.MaxPoll <= 0 {
		c.MaxPoll = 20_000
	}
	if c.CommitInterval <= 0 {
		c.CommitInterval = 500 * time.Millisecond
	}
	if c.MaxTxnRecords <= 0 {
		c.MaxTxnRecords = 200_000
	}
	if c.CloseEvery <= 0 {
		c.CloseEvery = time.Second
	}
	if c.StallAfter <= 0 {
		c.StallAfter = 2 * c.TxnTimeout
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	c.Windows.SetDefaults()
	c.Abuse.SetDefaults()
}

// part is the state of one decisions partition the loop owns: its usage
// windows and its keys' penalty state.
type part struct {
	win *windows.Table
	pen *abuse.Table
}

// txn is one poll's changes to a part, and the records it refused.
type txn struct {
	win *windows.Txn
	pen *abuse.Txn
	bad *refusals
}

func (x txn) empty() bool { return x.win.Empty() && x.pen.Empty() && len(x.pen.Steps()) == 0 }

// Processor runs the aggregation. Create it with New, then call Run once.
type Processor struct {
	cfg Config
	db  *state.DB
	log *slog.Logger
	m   *metrics

	mu           sync.Mutex
	materialized map[int32]int64 // next changelog offset Pebble holds, per partition
	advanced     chan struct{}   // closed and replaced when materialized moves
	ready        bool
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
	p := &Processor{cfg: cfg, db: db, log: cfg.Log, m: newMetrics(reg),
		materialized: map[int32]int64{}, advanced: make(chan struct{}), owned: map[int32]bool{}, lm: newLifeMetrics(reg)}
	p.setStage(StageStarting, nil)
	p.markRestore()
	return p
}

// Ready reports whether the materializer has caught up with the changelog
// as it was when Run started: reports are complete from then on.
func (p *Processor) Ready() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ready
}

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
	parts := p.parts

	offsets := map[int32]kgo.Offset{}
	for q := range parts {
		off, err := p.db.Offset(state.TopicChangelog, q)
		if err != nil {
			return err
		}
		offsets[q] = kgo.NewOffset().At(off)
		p.setMaterialized(q, off)
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
		if matErr = p.materialize(ctx, mat, start); matErr != nil {
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

// setup creates missing topics and checks Pebble's identity against the
// cluster and changelog topic; it returns the changelog's partitions.
func (p *Processor) setup(ctx context.Context, adm *kadm.Client) (map[int32]bool, error) {
	t := p.cfg.Topics
	var meta kadm.Metadata
	for attempt := 0; ; attempt++ {
		var err error
		meta, err = adm.Metadata(ctx, t.Decisions, t.Changelog, t.Usage, t.Penalties, t.Audit)
		if err == nil {
			p.setStage(StageStarting, nil)
			break
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("consume: kafka metadata: %w", err)
		}
		// Kafka may be down for long: say so once, then every 30 tries.
		p.setStage(StageStarting, err)
		if attempt%30 == 0 {
			p.log.Warn("kafka unreachable; retrying every second", slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Second):
		}
	}
	n := p.cfg.Partitions
	if d, ok := meta.Topics[t.Decisions]; ok && d.Err == nil && len(d.Partitions) > 0 {
		n = int32(len(d.Partitions))
	}
	create := func(topic string, configs map[string]*string) error {
		if topic == "" {
			return nil
		}
		if d, ok := meta.Topics[topic]; ok && d.Err == nil {
			return nil
		}
		resp, err := adm.CreateTopic(ctx, n, -1, configs, topic)
		if err == nil {
			err = resp.Err
		}
		if err != nil && !errors.Is(err, kerr.TopicAlreadyExists) {
			return fmt.Errorf("consume: create topic %s: %w", topic, err)
		}
		return nil
	}
	compact := "compact"
	// The broker's clock stamps decision records, so that no writer
	// chooses the time event times are checked against.
	logAppend := "LogAppendTime"
	if err := create(t.Decisions, map[string]*string{"message.timestamp.type": &logAppend}); err != nil {
		return nil, err
	}
	if err := create(t.Changelog, map[string]*string{"cleanup.policy": &compact}); err != nil {
		return nil, err
	}
	if err := create(t.Usage, nil); err != nil {
		return nil, err
	}
	if err := create(t.Penalties, nil); err != nil {
		return nil, err
	}
	forever := "-1"
	if err := create(t.Audit, map[string]*string{"retention.ms": &forever}); err != nil {
		return nil, err
	}
	// A topic just created may show no partitions for a moment.
	for attempt := 0; ; attempt++ {
		var err error
		meta, err = adm.Metadata(ctx, t.Decisions, t.Changelog)
		if err != nil {
			return nil, fmt.Errorf("consume: kafka metadata: %w", err)
		}
		if len(meta.Topics[t.Changelog].Partitions) > 0 && len(meta.Topics[t.Decisions].Partitions) > 0 || attempt == 50 {
			break
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	cl := meta.Topics[t.Changelog]
	if dn := len(meta.Topics[t.Decisions].Partitions); dn != len(cl.Partitions) {
		return nil, fmt.Errorf("consume: %s has %d partitions and %s %d: they must be co-partitioned",
			t.Decisions, dn, t.Changelog, len(cl.Partitions))
	}
	id := fmt.Sprintf("cluster=%s changelog=%s/%s", meta.Cluster, t.Changelog, cl.ID)
	wiped, err := p.db.CheckIdentity(id)
	if err != nil {
		return nil, err
	}
	if wiped {
		p.log.Warn("state was made against another Kafka cluster or changelog; rebuilding it from the changelog", slog.String("identity", id))
	}
	parts := map[int32]bool{}
	for q := range cl.Partitions {
		parts[q] = true
	}
	return parts, nil
}

// stableOffsets returns the last stable offset of every changelog
// partition.
func (p *Processor) stableOffsets(ctx context.Context, adm *kadm.Client) (map[int32]int64, error) {
	listed, err := adm.ListCommittedOffsets(ctx, p.cfg.Topics.Changelog)
	if err != nil {
		return nil, fmt.Errorf("consume: list changelog offsets: %w", err)
	}
	out := map[int32]int64{}
	var lerr error
	listed.Each(func(o kadm.ListedOffset) {
		if o.Err != nil {
			lerr = o.Err
			return
		}
		out[o.Partition] = o.Offset
	})
	if lerr != nil {
		return nil, fmt.Errorf("consume: list changelog offsets: %w", lerr)
	}
	return out, nil
}

func (p *Processor) setMaterialized(q int32, off int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if off > p.materialized[q] || off == 0 {
		p.materialized[q] = off
		close(p.advanced)
		p.advanced = make(chan struct{})
	}
}

// waitMaterialized blocks until Pebble holds partition q's changelog up to
// target.
func (p *Processor) waitMaterialized(ctx context.Context, q int32, target int64) error {
	for {
		p.mu.Lock()
		off, ch := p.materialized[q], p.advanced
		p.mu.Unlock()
		if off >= target {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// materialize tails the changelog into Pebble. Ready is set once every
// partition has reached start.
func (p *Processor) materialize(ctx context.Context, cl *kgo.Client, start map[int32]int64) error {
	caughtUp := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for q, off := range start {
			if p.materialized[q] < off {
				return false
			}
		}
		p.ready = true
		return true
	}
	ready := caughtUp()
	if ready {
		p.markRestore()
		p.log.Info("state restored", slog.Int("partitions", len(start)))
	}
	var recs []state.Record
	for {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			return nil
		}
		fs.EachError(func(topic string, part int32, err error) {
			p.log.Warn("changelog fetch failed", slog.Int("partition", int(part)), slog.String("error", err.Error()))
		})
		recs = recs[:0]
		next := map[int32]int64{}
		fs.EachRecord(func(r *kgo.Record) {
			rec := state.Record{Partition: r.Partition, Offset: r.Offset, Key: r.Key, Control: r.Attrs.IsControl()}
			if len(r.Value) > 0 {
				rec.Value = r.Value
			}
			recs = append(recs, rec)
			next[r.Partition] = r.Offset + 1
		})
		if len(recs) == 0 {
			continue
		}
		if err := p.db.Materialize(recs); err != nil {
			return err
		}
		p.m.materialized.Add(float64(len(recs)))
		for q, off := range next {
			p.setMaterialized(q, off)
		}
		if !ready && caughtUp() {
			ready = true
			p.markRestore()
			p.log.Info("state restored", slog.Int("partitions", len(start)))
		}
	}
}

// session is the transactional loop of one GroupTransactSession. It
// returns an *errSession when a transaction could not begin or commit:
// the session is then unusable (franz-go: no End error is retryable), and
// process replaces it.
func (p *Processor) session(ctx context.Context, base []kgo.Opt, adm *kadm.Client) error {
	t := p.cfg.Topics
	onAssigned := func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		p.member(m[t.Decisions], true)
	}
	onRevoked := func(_ context.Context, _ *kgo.Client, m map[string][]int32) {
		p.member(m[t.Decisions], false)
	}
	// Batches never exceed a topic's max.message.bytes, nor a rollup the
	// usage topic's (fitRollup cuts it).
	limits := p.topicLimits(ctx, adm)
	p.rollupLimit = int(limits[t.Usage])
	sess, err := kgo.NewGroupTransactSession(append(base,
		kgo.ProducerBatchMaxBytesFn(func(topic string) int32 {
			if n, ok := limits[topic]; ok {
				return n
			}
			return defaultMaxMessageBytes
		}),
		kgo.ConsumerGroup(p.cfg.Group),
		kgo.ConsumeTopics(t.Decisions),
		kgo.TransactionalID("tollgate-aggregator-"+p.cfg.InstanceID),
		kgo.TransactionTimeout(p.cfg.TxnTimeout),
		kgo.SessionTimeout(p.cfg.SessionTimeout),
		kgo.HeartbeatInterval(min(3*time.Second, p.cfg.SessionTimeout/4)),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.RequireStableFetchOffsets(),
		kgo.RecordPartitioner(kgo.ManualPartitioner()),
		kgo.OnPartitionsAssigned(onAssigned),
		kgo.OnPartitionsRevoked(onRevoked),
		kgo.OnPartitionsLost(onRevoked),
	)...)
	if err != nil {
		return fmt.Errorf("consume: transact session: %w", err)
	}
	defer func() {
		// Leave the group at once so the partitions move without waiting
		// for the session timeout. Should leaving fail (Kafka away), the
		// member lingers until then: it is not another instance.
		p.lastMember, _ = sess.Client().GroupMetadata()
		sess.Close()
	}()

	out := outParts{usage: p.cfg.Partitions, penalties: p.cfg.Partitions, audit: p.cfg.Partitions}
	if meta, err := adm.Metadata(ctx, t.Usage, t.Penalties, t.Audit); err == nil {
		for topic, dst := range map[string]*int32{t.Usage: &out.usage, t.Penalties: &out.penalties, t.Audit: &out.audit} {
			if n := len(meta.Topics[topic].Partitions); n > 0 {
				*dst = int32(n)
			}
		}
	}

	tables := map[int32]*part{}
	lastClose := p.cfg.Now()
	ticks := 0
	var ev event
	// One Kafka transaction spans the polls of up to CommitInterval (or
	// MaxTxnRecords events): a row that many events touch is written to
	// the changelog once per transaction, not once per poll (Kafka
	// Streams' commit interval). A lull commits at once.
	txns := map[int32]txn{}
	var txnStart time.Time
	pending := 0
	for ctx.Err() == nil {
		pollCtx, cancel := context.WithTimeout(ctx, p.cfg.CloseEvery)
		fs := sess.PollRecords(pollCtx, p.cfg.MaxPoll)
		cancel()
		if ctx.Err() != nil {
			break
		}
		fs.EachError(func(topic string, part int32, err error) {
			if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
				p.log.Warn("decisions fetch failed", slog.Int("partition", int(part)), slog.String("error", err.Error()))
			}
		})
		if p.applyMembership(tables) {
			// A revocation aborts the open transaction (the session
			// refuses to commit it): its changes go too.
			clear(txns)
		}

		now := p.cfg.Now()
		nowSec := now.Unix()
		if len(txns) == 0 {
			txnStart = now
		}
		if !fs.Empty() {
			p.busy(now)
		}
		txnOf := func(q int32) (txn, error) {
			if x, ok := txns[q]; ok {
				return x, nil
			}
			tab, ok := tables[q]
			if !ok {
				var err error
				if tab, err = p.restore(ctx, adm, q); err != nil {
					return txn{}, err
				}
				tables[q] = tab
			}
			x := txn{win: tab.win.Begin(), pen: tab.pen.Begin(), bad: &refusals{}}
			txns[q] = x
			return x, nil
		}
		polled := 0
		var ferr error
		fs.EachPartition(func(fp kgo.FetchTopicPartition) {
			if ferr != nil || len(fp.Records) == 0 {
				return
			}
			x, err := txnOf(fp.Partition)
			if err != nil {
				ferr = err
				return
			}
			last := fp.Records[len(fp.Records)-1]
			p.m.lag.WithLabelValues(fmt.Sprint(fp.Partition)).Set(float64(max(0, fp.HighWatermark-last.Offset-1)))
			for _, r := range fp.Records {
				polled++
				if err := decodeEvent(r.Value, &ev); err != nil || (ev.Kind == 0 && !ev.Lift) {
					p.m.events.WithLabelValues("malformed").Inc()
					continue
				}
				if reason, identity := check(&ev, fp.Partition, r.Timestamp, now); reason != "" {
					// Never applied, never an error: the partition goes on.
					// A bad field of a well-identified event uses its
					// number (it is not missing); a bad identity touches
					// no mark.
					if identity || ev.Lift || x.win.Refuse(&ev.Event, nowSec) {
						x.bad.add(reason, &ev, r)
					}
					continue
				}
				if ev.Lift {
					// A command: applying it twice changes nothing, so it
					// needs no sequence number (docs/aggregator.md).
					p.m.events.WithLabelValues("command").Inc()
					x.pen.Lift(abuse.Lift{KeyID: ev.KeyID, Tenant: ev.Tenant, TimeMicros: ev.TimeMicros,
						Actor: ev.Actor, Reason: ev.CmdReason}, now)
					continue
				}
				applied, err := x.win.Apply(&ev.Event, nowSec)
				if err != nil {
					ferr = err
					return
				}
				if applied && ev.Kind == windows.KindDecision {
					d := abuse.Decision{KeyID: ev.KeyID, KeyPrefix: ev.KeyPrefix, Tenant: ev.Tenant, TimeMicros: ev.TimeMicros,
						Allowed: ev.Allowed, RetryAfter: ev.RetryAfter}
					if ev.Allowlisted {
						d.Reason = abuse.ReasonAllowlisted
					}
					x.pen.Observe(&d, now)
				}
			}
		})
		if ferr != nil {
			if ctx.Err() != nil {
				break
			}
			return ferr
		}
		pending += polled
		for _, x := range txns {
			x.pen.Evaluate(now)
		}
		if now.Sub(lastClose) >= p.cfg.CloseEvery {
			lastClose = now
			ticks++
			// Every partition owned ticks, idle or not: windows close
			// and penalties step down without new decisions.
			for _, q := range p.Owned() {
				if _, err := txnOf(q); err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
			}
			for q := range tables {
				x, err := txnOf(q)
				if err != nil {
					return err
				}
				if err := x.win.CloseDue(nowSec); err != nil {
					return err
				}
				x.pen.Tick(now)
				if ticks%60 == 1 {
					if err := p.expire(q, tables[q].win, x.win, nowSec); err != nil {
						return err
					}
				}
			}
			p.gaugePenalties(tables, now)
		}
		changed := false
		for _, x := range txns {
			if !x.empty() {
				changed = true
			}
		}
		if pending == 0 && !changed {
			p.idle()
			clear(txns)
			continue
		}
		p.busy(now)
		// A poll that came back (nearly) full means a backlog: fold the
		// next poll into this transaction. Anything less is a lull.
		backlog := polled >= p.cfg.MaxPoll/4
		if backlog && now.Sub(txnStart) < p.cfg.CommitInterval && pending < p.cfg.MaxTxnRecords {
			continue
		}
		committed, err := p.commit(ctx, sess, txns, out, now)
		clear(txns)
		pending = 0
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			p.m.txns.WithLabelValues("error").Inc()
			return &errSession{err}
		}
		if !committed {
			p.m.txns.WithLabelValues("aborted").Inc()
			continue
		}
		p.m.txns.WithLabelValues("committed").Inc()
		p.committed(now)
		if ticks > 0 && now.Equal(lastClose) {
			for q, tab := range tables {
				p.mu.Lock()
				off := p.materialized[q]
				p.mu.Unlock()
				tab.win.Evict(off - 1)
			}
			var n, keys int
			for _, tab := range tables {
				n += tab.win.Len()
				keys += tab.pen.Len()
			}
			p.m.rows.Set(float64(n))
			p.m.penaltyKeys.Set(float64(keys))
		}
	}
	return nil
}

// commit produces the transactions' changes and commits them with the
// consumed offsets. Tables change only when it reports committed.
// outParts are the partition counts of the topics the loop produces to
// besides the changelog (co-partitioned with the decisions topic).
type outParts struct{ usage, penalties, audit int32 }

func (p *Processor) commit(ctx context.Context, sess *kgo.GroupTransactSession, txns map[int32]txn, out outParts, now time.Time) (bool, error) {
	if err := sess.Begin(); err != nil {
		return false, fmt.Errorf("consume: begin transaction: %w", err)
	}
	t := p.cfg.Topics
	var mu sync.Mutex
	written := map[int32]int64{}
	var perr error
	var tooLarge oversizedRollups
	promise := func(r *kgo.Record, err error) {
		if err != nil && r.Topic == t.Usage {
			tooLarge.note(r, err)
		}
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			perr = err
			return
		}
		if r.Topic == t.Changelog && r.Offset > written[r.Partition] {
			written[r.Partition] = r.Offset
		}
	}
	stats := windows.Stats{}
	published := 0
	var truncated, skipped int
	var bad []*refusals
	var steps []abuse.Step
	firings := map[string]int{}
	for q, tx := range txns {
		x := tx.win
		s := x.Stats()
		stats.Applied += s.Applied
		stats.Duplicates += s.Duplicates
		stats.Late += s.Late
		stats.Missing += s.Missing
		stats.Expired += s.Expired
		stats.Held += s.Held
		stats.Discarded += s.Discarded
		stats.Accepted += s.Accepted
		stats.Filled += s.Filled
		stats.AfterClose += s.AfterClose
		if tx.bad != nil {
			bad = append(bad, tx.bad)
		}
		for _, c := range x.Changes() {
			rec := &kgo.Record{Topic: t.Changelog, Partition: q}
			switch {
			case c.Row != nil:
				rec.Key = state.RowKey(*c.Row)
				if !c.Deleted {
					rec.Value = state.RowValue(c.Value)
				}
			default:
				rec.Key = state.MarkKey(c.Source)
				if !c.Deleted {
					rec.Value = state.MarkValue(c.Mark)
				}
			}
			sess.Produce(ctx, rec, promise)
			if c.Publish {
				// Cut to fit the topic: one oversized window must not
				// abort every transaction (and freeze every rollup).
				k, v, cut, ok, err := fitRollup(*c.Row, &c.Value, now.Unix(), p.rollupLimit)
				if err != nil {
					return false, err
				}
				switch {
				case !ok:
					skipped++
					continue
				case cut:
					truncated++
				}
				sess.Produce(ctx, &kgo.Record{Topic: t.Usage, Partition: q % out.usage, Key: k, Value: v}, promise)
				published++
			}
		}
		for _, c := range tx.pen.Changes() {
			rec := &kgo.Record{Topic: t.Changelog, Partition: q, Key: state.PenaltyKey(q, c.KeyID)}
			if !c.Deleted {
				rec.Value = state.PenaltyValue(c.State)
			}
			sess.Produce(ctx, rec, promise)
		}
		for _, st := range tx.pen.Steps() {
			pe, ae := stepRecords(st, now)
			pv, err := proto.Marshal(pe)
			if err != nil {
				return false, fmt.Errorf("consume: encode penalty event: %w", err)
			}
			sess.Produce(ctx, &kgo.Record{Topic: t.Penalties, Partition: q % out.penalties, Key: []byte(st.KeyID), Value: pv}, promise)
			ar, err := audit.Record(t.Audit, ae)
			if err != nil {
				return false, err
			}
			ar.Partition = q % out.audit
			sess.Produce(ctx, ar, promise)
			steps = append(steps, st)
		}
		for d, n := range tx.pen.Firings() {
			firings[d] += n
		}
	}
	if err := sess.Client().Flush(ctx); err != nil {
		return false, err
	}
	mu.Lock()
	failed := perr
	mu.Unlock()
	committed, err := sess.End(ctx, kgo.TransactionEndTry(failed == nil))
	if err != nil {
		return false, fmt.Errorf("consume: end transaction: %w", errors.Join(err, failed))
	}
	if failed != nil {
		p.log.Warn("transaction aborted: a record was not produced", slog.String("error", failed.Error()))
		p.limitRollups(tooLarge.largest)
	}
	if !committed {
		return false, nil
	}
	for q, x := range txns {
		x.win.Commit(written[q])
		x.pen.Commit()
	}
	for _, st := range steps {
		p.m.penalties.WithLabelValues(strconv.Itoa(st.Level), st.Action).Inc()
		p.log.Info("penalty step", slog.String("key_id", st.KeyID), slog.String("key_prefix", st.KeyPrefix),
			slog.Int("level", st.Level), slog.Int("previous_level", st.Previous), slog.String("action", st.Action),
			slog.String("issued_by", st.IssuedBy), slog.String("reason", st.Reason))
	}
	for d, n := range firings {
		p.m.firings.WithLabelValues(d).Add(float64(n))
	}
	p.m.events.WithLabelValues("applied").Add(float64(stats.Applied))
	p.m.events.WithLabelValues("duplicate").Add(float64(stats.Duplicates))
	p.m.late.Add(float64(stats.Late))
	p.m.missing.Add(float64(stats.Missing))
	p.m.expired.Add(float64(stats.Expired))
	p.m.published.Add(float64(published))
	p.m.poison.oversized.WithLabelValues("truncated").Add(float64(truncated))
	p.m.poison.oversized.WithLabelValues("skipped").Add(float64(skipped))
	if truncated+skipped > 0 {
		p.log.Warn("usage records too large for the usage topic were cut", slog.Int("truncated", truncated),
			slog.Int("skipped", skipped), slog.Int("max_bytes", p.rollupLimit))
	}
	p.countPoison(bad, stats)
	p.poison.flush(p.log, now)
	return true, nil
}

// expire deletes partition q's rows whose retention has passed: those in
// memory and, a bounded number per call, those only in Pebble.
func (p *Processor) expire(q int32, tab *windows.Table, x *windows.Txn, nowSec int64) error {
	x.Expire(nowSec)
	budget := 10_000
	for _, g := range windows.All {
		cut := nowSec - int64(p.cfg.Windows.Retention[g]/time.Second)
		err := p.db.ExpiredRows(q, g, cut, func(k windows.RowKey) bool {
			x.ExpireRow(k, nowSec)
			budget--
			return budget > 0
		})
		if err != nil {
			return err
		}
	}
	return nil
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
	if err := p.waitMaterialized(ctx, q, o.Offset); err != nil {
		return nil, err
	}
	open, marks, err := p.db.LoadPartition(q)
	if err != nil {
		return nil, err
	}
	pens, err := p.db.LoadPenalties(q)
	if err != nil {
		return nil, err
	}
	p.log.Info("partition state restored", slog.Int("partition", int(q)), slog.Int("open_rows", len(open)),
		slog.Int("sources", len(marks)), slog.Int("penalty_keys", len(pens)), slog.Int64("changelog_offset", o.Offset),
		slog.Duration("took", time.Since(start)))
	p.m.restores.Inc()
	return &part{win: windows.NewTable(p.cfg.Windows, q, p.db, open, marks), pen: abuse.NewTable(p.cfg.Abuse, q, pens)}, nil
}

// metrics are the processor's collectors.
type metrics struct {
	events       *prometheus.CounterVec
	late         prometheus.Counter
	missing      prometheus.Counter
	expired      prometheus.Counter
	published    prometheus.Counter
	materialized prometheus.Counter
	txns         *prometheus.CounterVec
	restores     prometheus.Counter
	owned        prometheus.Gauge
	rows         prometheus.Gauge
	lag          *prometheus.GaugeVec
	penalties    *prometheus.CounterVec
	penalized    *prometheus.GaugeVec
	firings      *prometheus.CounterVec
	volumeKeys   prometheus.Gauge
	penaltyKeys  prometheus.Gauge
	poison       *poisonMetrics
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_aggregator_events_total",
			Help: "Decision events consumed, by result: applied (counted, exactly once), duplicate (at or below its source's high-water mark: a replay), malformed (not a decision event this aggregator reads), command (a penalty lift), invalid (a field outside its bound: refused, see tollgate_aggregator_events_invalid_total), held (a sequence jump beyond the bound, not applied until confirmed).",
		}, []string{"result"}),
		late: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_aggregator_events_late_total",
			Help: "Events that arrived after their window was published (counted in the report rows anyway; the window is republished with a new revision).",
		}),
		missing: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_aggregator_events_missing_total",
			Help: "Sequence numbers never delivered: gaps in a gateway epoch's sequence, and the numbers the gateway used after its last delivered event when an EpochClosed marker closes the epoch (0 after a graceful stop; after a gateway's SIGKILL exactly what was lost; after a machine crash up to one sequence reservation per partition more).",
		}),
		expired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_aggregator_rows_expired_total",
			Help: "Usage rows deleted after their retention (a tombstone in the changelog).",
		}),
		published: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_aggregator_rollups_published_total",
			Help: "Closed windows published to the usage topic (republications after late events included).",
		}),
		materialized: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_aggregator_changelog_records_total",
			Help: "Changelog records materialized into this instance's Pebble.",
		}),
		txns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tollgate_aggregator_transactions_total",
			Help: "Kafka transactions, by result: committed, aborted (a rebalance: reprocessed), error (state rebuilt from the changelog).",
		}, []string{"result"}),
		restores: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tollgate_aggregator_partition_restores_total",
			Help: "Partition states built from Pebble after an assignment.",
		}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_aggregator_partitions_owned",
			Help: "Decisions partitions this instance processes.",
		}),
		rows: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tollgate_aggregator_rows_in_memory",
			Help: "Usage rows held in memory (open windows and recent writes).",
		}),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tollgate_aggregator_consumer_lag",
			Help: "Decision events behind the partition's high watermark at the last poll, by partition.",
		}, []string{"partition"}),
	}
	m.penalties = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_aggregator_penalties_total",
		Help: "Penalty ladder steps taken by the partitions this instance owns, by level after the step and action (reduced_limit, cooldown, blocklist, step_down, lifted).",
	}, []string{"level", "action"})
	m.penalized = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "tollgate_aggregator_penalized_keys",
		Help: "Keys whose penalty is enforced now, by level, in the partitions this instance owns (sum over instances for the fleet).",
	}, []string{"level"})
	m.firings = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tollgate_aggregator_detector_firings_total",
		Help: "Times an abuse detector fired on a key (its evidence then starts again), by detector: backoff_ignored, sustained_rejection, volume_ceiling.",
	}, []string{"detector"})
	m.volumeKeys = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tollgate_aggregator_volume_ceiling_keys",
		Help: "Keys the volume_ceiling detector fired on within the last detection window, in the partitions this instance owns.",
	})
	m.penaltyKeys = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "tollgate_aggregator_penalty_state_keys",
		Help: "Keys whose detector and ladder state this instance holds in memory (seen within the idle time, or penalised).",
	})
	m.poison = newPoisonMetrics()
	for l := 1; l <= abuse.MaxLevel; l++ {
		m.penalized.WithLabelValues(strconv.Itoa(l))
	}
	for _, r := range []string{"applied", "duplicate", "malformed", "command", "invalid", "held"} {
		m.events.WithLabelValues(r)
	}
	for _, d := range abuse.Detectors {
		m.firings.WithLabelValues(d)
	}
	if reg != nil {
		reg.MustRegister(m.events, m.late, m.missing, m.expired, m.published, m.materialized, m.txns, m.restores, m.owned, m.rows, m.lag,
			m.penalties, m.penalized, m.firings, m.volumeKeys, m.penaltyKeys)
		reg.MustRegister(m.poison.collectors()...)
	}
	return m
}

// gaugePenalties sets the gauges of penalised keys from the tables owned.
func (p *Processor) gaugePenalties(tables map[int32]*part, now time.Time) {
	var levels [abuse.MaxLevel + 1]int
	volume := 0
	for _, tab := range tables {
		l := tab.pen.Levels(now)
		for i := range levels {
			levels[i] += l[i]
		}
		volume += tab.pen.VolumeKeys(now)
	}
	for l := 1; l <= abuse.MaxLevel; l++ {
		p.m.penalized.WithLabelValues(strconv.Itoa(l)).Set(float64(levels[l]))
	}
	p.m.volumeKeys.Set(float64(volume))
}
