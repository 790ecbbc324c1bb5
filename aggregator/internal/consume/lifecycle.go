package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/internal/promdef"
)

// Errors of the processor's lifecycle.
var (
	// ErrDuplicateID is returned by Run when another live member of the
	// consumer group carries this instance's id: two instances with one
	// transactional id would fence each other.
	ErrDuplicateID = errors.New("consume: another live aggregator uses this instance id")
)

// Stages of the processor, as Health reports them.
const (
	// StageStarting: Setup is reaching Kafka and creating the topics.
	StageStarting = "starting"
	// StageCheckingID: before joining the group, the processor waits to
	// see whether a member carrying its id is alive.
	StageCheckingID = "checking_id"
	// StageRunning: a transactional session is in the group.
	StageRunning = "running"
	// StageRebuilding: a transaction could not begin or commit; the
	// session is closed (its partitions released) and replaced.
	StageRebuilding = "rebuilding"
	// StageFenced: another instance with the same id took the
	// transactional id over; this one holds no partition and stands by
	// until that instance leaves the group.
	StageFenced = "fenced"
	// StageStopped: Run has returned.
	StageStopped = "stopped"
)

// Reasons Health.Problem gives for not being able to count.
const (
	ReasonStarting          = "starting"
	ReasonCheckingID        = "checking_id"
	ReasonRestoring         = "restoring"
	ReasonFenced            = "fenced"
	ReasonTransactionFailed = "transaction_failed"
	ReasonStalled           = "stalled"
	ReasonStopped           = "stopped"
)

// Health is what the processor is doing, for readiness.
type Health struct {
	Stage      string
	StageSince time.Time
	// Error is the error behind the stage (Kafka's while starting, the
	// transaction's while rebuilding or fenced), "" when none.
	Error string
	// Restored: the materializer has caught up with the changelog as it
	// was when Run started (RestoredSince: when; else when Run started).
	Restored      bool
	RestoredSince time.Time
	// TxnError is the last transaction failure not yet followed by a
	// commit or an idle poll of a new session; TxnErrorSince is its first
	// occurrence.
	TxnError      string
	TxnErrorSince time.Time
	// Pending is when work not yet committed was first polled (zero:
	// none); LastCommit is the last committed transaction.
	Pending    time.Time
	LastCommit time.Time
	// StallAfter is how long pending work may wait for a commit before
	// the processor counts as stalled.
	StallAfter time.Duration
	Partitions []int32
}

// Problem returns why the processor cannot count now (reason "" when it
// can), a message for people, and since when.
func (h Health) Problem(now time.Time) (reason, msg string, since time.Time) {
	switch h.Stage {
	case StageStarting:
		msg = "creating or checking the topics"
		if h.Error != "" {
			msg = "Kafka has not answered: " + h.Error
		}
		return ReasonStarting, msg, h.StageSince
	case StageStopped:
		return ReasonStopped, "the processor has stopped", h.StageSince
	case StageFenced:
		return ReasonFenced, "another instance with this aggregator_id took its transactional id over; " +
			"standing by with no partition until it leaves the group: " + h.Error, h.StageSince
	case StageCheckingID:
		return ReasonCheckingID, "a member of the consumer group carries this aggregator_id; " +
			"waiting for it to expire (a crashed predecessor) before joining", h.StageSince
	}
	if !h.Restored {
		return ReasonRestoring, "restoring the state from the changelog", h.RestoredSince
	}
	if h.Stage == StageRebuilding || h.TxnError != "" {
		return ReasonTransactionFailed, "a transaction could not begin or commit; the session is rebuilt: " + h.TxnError, h.TxnErrorSince
	}
	if !h.Pending.IsZero() && now.Sub(h.Pending) > h.StallAfter {
		last := "never"
		if !h.LastCommit.IsZero() {
			last = h.LastCommit.UTC().Format(time.RFC3339)
		}
		return ReasonStalled, fmt.Sprintf("events polled at %s are not committed after %v (last commit: %s)",
			h.Pending.UTC().Format(time.RFC3339), h.StallAfter, last), h.Pending.Add(h.StallAfter)
	}
	return "", "", time.Time{}
}

// life is the processor's lifecycle state, guarded by its own mutex
// (never held with Processor.mu).
type life struct {
	mu            sync.Mutex
	stage         string
	stageSince    time.Time
	err           string
	restoredSince time.Time
	txnErr        string
	txnErrSince   time.Time
	pending       time.Time
	lastCommit    time.Time
}

// lifeMetrics are the lifecycle's collectors.
type lifeMetrics struct {
	rebuilds *prometheus.CounterVec
}

func newLifeMetrics(reg prometheus.Registerer) *lifeMetrics {
	m := &lifeMetrics{rebuilds: promdef.CounterVec("tollgate_aggregator_session_rebuilds_total", "Transactional sessions closed and replaced, by reason: fenced (another producer took the transactional id over), transaction_failed (a transaction could not begin or commit).", "reason")}
	for _, r := range []string{ReasonFenced, ReasonTransactionFailed} {
		m.rebuilds.WithLabelValues(r)
	}
	if reg != nil {
		reg.MustRegister(m.rebuilds)
	}
	return m
}

// Health returns what the processor is doing now.
func (p *Processor) Health() Health {
	p.life.mu.Lock()
	h := Health{Stage: p.life.stage, StageSince: p.life.stageSince, Error: p.life.err,
		RestoredSince: p.life.restoredSince, TxnError: p.life.txnErr, TxnErrorSince: p.life.txnErrSince,
		Pending: p.life.pending, LastCommit: p.life.lastCommit, StallAfter: p.cfg.StallAfter}
	p.life.mu.Unlock()
	h.Restored = p.Ready()
	h.Partitions = p.Owned()
	slices.Sort(h.Partitions)
	return h
}

// setStage records the stage and the error behind it.
func (p *Processor) setStage(stage string, err error) {
	now := p.cfg.Now()
	p.life.mu.Lock()
	defer p.life.mu.Unlock()
	if p.life.stage != stage {
		p.life.stage, p.life.stageSince = stage, now
	}
	p.life.err = ""
	if err != nil {
		p.life.err = err.Error()
	}
}

// markRestore records when the restore began, and again when it ended.
func (p *Processor) markRestore() {
	p.life.mu.Lock()
	defer p.life.mu.Unlock()
	p.life.restoredSince = p.cfg.Now()
}

// busy records that the loop holds work not yet committed.
func (p *Processor) busy(now time.Time) {
	p.life.mu.Lock()
	defer p.life.mu.Unlock()
	if p.life.pending.IsZero() {
		p.life.pending = now
	}
}

// idle records that the loop holds no uncommitted work. A new session
// that has nothing to commit is sound again once it owns partitions (work
// left by the failed one is polled again first), or once it has had the
// time to join and was given none.
func (p *Processor) idle() {
	owns := len(p.Owned()) > 0
	now := p.cfg.Now()
	p.life.mu.Lock()
	defer p.life.mu.Unlock()
	p.life.pending = time.Time{}
	if p.life.stage == StageRunning && (owns || now.Sub(p.life.stageSince) > p.cfg.SessionTimeout+twinCheckMargin) {
		p.life.txnErr = ""
	}
}

// committed records a committed transaction.
func (p *Processor) committed(now time.Time) {
	p.life.mu.Lock()
	defer p.life.mu.Unlock()
	p.life.pending, p.life.lastCommit, p.life.txnErr = time.Time{}, now, ""
}

// txnFailed records a failed transaction.
func (p *Processor) txnFailed(err error) {
	now := p.cfg.Now()
	p.life.mu.Lock()
	defer p.life.mu.Unlock()
	if p.life.txnErr == "" {
		p.life.txnErrSince = now
	}
	p.life.txnErr = err.Error()
}

// errSession wraps what ended a transactional session that the processor
// replaces with a new one.
type errSession struct{ err error }

func (e *errSession) Error() string { return e.err.Error() }
func (e *errSession) Unwrap() error { return e.err }

// fenced reports whether err means another producer took this
// instance's transactional id over (or the broker aborted its
// transaction and bumped its epoch).
func fenced(err error) bool {
	return errors.Is(err, kerr.ProducerFenced) || errors.Is(err, kerr.InvalidProducerEpoch) ||
		errors.Is(err, kerr.InvalidProducerIDMapping) || errors.Is(err, kerr.TransactionalIDNotFound)
}

// clientID is the Kafka client id of the processor's session: the group
// lists it for each member, which is how an instance sees another live
// instance with its id.
func (p *Processor) clientID() string { return "tollgate-aggregator-" + p.cfg.InstanceID }

// twinCheckMargin is added to the session timeout when waiting for a
// member with this instance's id to expire: a few heartbeats' worth.
const twinCheckMargin = 3 * time.Second

// twins returns the members of the group whose client id is this
// instance's, but for its own last session's, and the group's state.
func (p *Processor) twins(ctx context.Context, adm *kadm.Client) ([]kadm.DescribedGroupMember, string, error) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	groups, err := adm.DescribeGroups(dctx, p.cfg.Group)
	if err != nil {
		return nil, "", fmt.Errorf("consume: describe group %s: %w", p.cfg.Group, err)
	}
	g, ok := groups[p.cfg.Group]
	if !ok {
		return nil, "", nil
	}
	if g.Err != nil {
		if errors.Is(g.Err, kerr.GroupIDNotFound) {
			return nil, "", nil
		}
		return nil, "", fmt.Errorf("consume: describe group %s: %w", p.cfg.Group, g.Err)
	}
	var out []kadm.DescribedGroupMember
	for _, m := range g.Members {
		if m.ClientID == p.clientID() && (p.lastMember == "" || m.MemberID != p.lastMember) {
			out = append(out, m)
		}
	}
	return out, g.State, nil
}

// describeMembers names members for logs and errors.
func describeMembers(ms []kadm.DescribedGroupMember) string {
	var b strings.Builder
	for i, m := range ms {
		if i > 0 {
			b.WriteString(", ")
		}
		fmt.Fprintf(&b, "member %s on %s", m.MemberID, m.ClientHost)
	}
	return b.String()
}

// awaitNoTwin returns once no member of the group carries this
// instance's id.
//
// Before the first session (first), a member seen is either a crashed
// predecessor (it stays listed until its session times out) or another
// live instance (it heartbeats, and stays): the processor waits up to the
// session timeout plus a margin, longer while the group rebalances, and
// then returns ErrDuplicateID. After a fencing it stands by (StageFenced)
// for as long as the member is there: the other instance owns the id now,
// and this one takes over once it leaves.
func (p *Processor) awaitNoTwin(ctx context.Context, adm *kadm.Client, first bool) error {
	var deadline time.Time
	var lastLog time.Time
	for attempt := 0; ; attempt++ {
		ms, state, err := p.twins(ctx, adm)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			if attempt%30 == 0 {
				p.log.Warn("cannot describe the consumer group; retrying", slog.String("error", err.Error()))
			}
		case len(ms) == 0:
			return nil
		case first:
			now := p.cfg.Now()
			if deadline.IsZero() {
				deadline = now.Add(p.cfg.SessionTimeout + twinCheckMargin)
				p.setStage(StageCheckingID, nil)
				p.log.Warn("a member of the consumer group carries this aggregator_id; waiting for it to expire before joining",
					slog.String("group", p.cfg.Group), slog.String("members", describeMembers(ms)),
					slog.Duration("wait", p.cfg.SessionTimeout+twinCheckMargin))
			}
			if rebalancing := state == "PreparingRebalance" || state == "CompletingRebalance"; rebalancing && now.After(deadline) &&
				now.Before(deadline.Add(time.Minute)) {
				break // a member that died mid-rebalance is dropped when the rebalance ends
			}
			if now.After(deadline) {
				return fmt.Errorf("%w %q: %s of group %s is still heartbeating after %v",
					ErrDuplicateID, p.cfg.InstanceID, describeMembers(ms), p.cfg.Group, p.cfg.SessionTimeout+twinCheckMargin)
			}
		default:
			p.setStage(StageFenced, errors.New(describeMembers(ms)))
			if now := p.cfg.Now(); now.Sub(lastLog) >= time.Minute {
				lastLog = now
				p.log.Error("fenced: another aggregator with this aggregator_id is in the consumer group; standing by with no partition until it leaves",
					slog.String("aggregator_id", p.cfg.InstanceID), slog.String("members", describeMembers(ms)))
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// release forgets every partition: the session that owned them is closed.
func (p *Processor) release() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for q := range p.owned {
		delete(p.owned, q)
		p.m.lag.DeleteLabelValues(fmt.Sprint(q))
	}
	p.memberEvents = nil
	p.m.owned.Set(0)
}

// process runs transactional sessions until ctx is done. A session whose
// transaction cannot begin or commit — fenced by another producer with
// the same transactional id, or failing otherwise — is closed, which
// releases its partitions to the group and discards its tables, and
// replaced by a new one (whose producer id fences the old), after a
// backoff and once no other live member carries this instance's id.
func (p *Processor) process(ctx context.Context, base []kgo.Opt, adm *kadm.Client) error {
	base = append(slices.Clip(base), kgo.ClientID(p.clientID()))
	backoff := time.Second
	for first := true; ; first = false {
		if err := p.awaitNoTwin(ctx, adm, first); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		p.setStage(StageRunning, nil)
		err := p.session(ctx, base, adm)
		p.release()
		if ctx.Err() != nil {
			return nil
		}
		var se *errSession
		if !errors.As(err, &se) {
			return err
		}
		reason := ReasonTransactionFailed
		if fenced(err) {
			reason = ReasonFenced
		}
		p.lm.rebuilds.WithLabelValues(reason).Inc()
		p.txnFailed(err)
		p.setStage(StageRebuilding, err)
		p.log.Error("transaction failed; closing the session, releasing its partitions, and starting a new one",
			slog.String("reason", reason), slog.String("error", err.Error()), slog.Duration("backoff", backoff))
		if p.sinceCommit() < time.Minute {
			backoff = time.Second
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

// sinceCommit is how long ago the last transaction committed (forever:
// never).
func (p *Processor) sinceCommit() time.Duration {
	p.life.mu.Lock()
	defer p.life.mu.Unlock()
	if p.life.lastCommit.IsZero() {
		return time.Duration(1<<63 - 1)
	}
	return p.cfg.Now().Sub(p.life.lastCommit)
}
