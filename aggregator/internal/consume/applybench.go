package consume

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// applyTemplates is how many encoded decision events an ApplyBench cycles
// through; the key_id of each event is set after its decoding.
const applyTemplates = 4096

// applyCommitEvery is how many events an ApplyBench run counts between
// two commits of its tables, as a transaction of a backlog would.
const applyCommitEvery = 20_000

// ApplyBench is the aggregator's work per decision event without Kafka:
// decoding, checking the bounds, counting into a partition's windows (3
// rows per event) and, with detectors, feeding the abuse detectors. The
// benchmark of this package and loadtest's key-count sweep run it.
type ApplyBench struct {
	recs  [][]byte
	names []string
}

// NewApplyBench prepares a run of events events over keys distinct
// key_ids: event i has key (i mod keys), so with keys ≥ events every event
// is a different key. The names are made here, outside the measured work.
func NewApplyBench(keys, events int) (*ApplyBench, error) {
	if keys < 1 || events < 1 {
		return nil, fmt.Errorf("consume: apply bench of %d events over %d keys: both must be ≥ 1", events, keys)
	}
	a := &ApplyBench{recs: make([][]byte, applyTemplates), names: make([]string, min(keys, events))}
	for i := range a.recs {
		v, err := proto.Marshal(&tollgatev1.DecisionEvent{GatewayId: "gw-1", Epoch: 1, Partition: 0,
			TimeUnixMicros: 1_700_000_000_000_000, Kind: tollgatev1.DecisionEvent_KIND_DECISION,
			KeyId: fmt.Sprintf("key-%018d", i), KeyPrefix: "sk_prod_ab…", Tenant: fmt.Sprint("tenant-", i%100),
			Endpoint: "/v1/orders", Method: "POST", Cost: 1, RuleId: "orders", Algorithm: "token_bucket", Allowed: i%10 != 0,
			Reason: "allowed", Status: 200, Remaining: 10, ClientIp: "10.1.2.3", Surface: "proxy"})
		if err != nil {
			return nil, fmt.Errorf("consume: apply bench: %w", err)
		}
		a.recs[i] = v
	}
	for i := range a.names {
		a.names[i] = fmt.Sprintf("key-%018d", i) // as long as the templates' key_ids
	}
	return a, nil
}

// Run counts n events into fresh tables, committing every
// applyCommitEvery events; with detect, the detectors see each one too.
func (a *ApplyBench) Run(n int, detect bool) error {
	tab := windows.NewTable(windows.Config{}, 0, nil, nil, nil)
	pen := abuse.NewTable(abuse.Config{}, 0, nil)
	now := time.Unix(1_700_000_000, 0)
	var ev event
	x, px := tab.Begin(), pen.Begin()
	for i := range n {
		if err := decodeEvent(a.recs[i%len(a.recs)], &ev); err != nil {
			return fmt.Errorf("consume: apply bench: decode: %w", err)
		}
		ev.KeyID = a.names[i%len(a.names)]
		ev.Seq = uint64(i + 1)
		if reason, _ := check(&ev, 0, now, now); reason != "" {
			return fmt.Errorf("consume: apply bench: event %d refused: %s", i, reason)
		}
		applied, err := x.Apply(&ev.Event, 1_700_000_000)
		if err != nil {
			return fmt.Errorf("consume: apply bench: apply: %w", err)
		}
		if applied && detect {
			d := abuse.Decision{KeyID: ev.KeyID, KeyPrefix: ev.KeyPrefix, Tenant: ev.Tenant, TimeMicros: ev.TimeMicros,
				Allowed: ev.Allowed, RetryAfter: ev.RetryAfter}
			px.Observe(&d, now)
		}
		if i%applyCommitEvery == applyCommitEvery-1 {
			px.Evaluate(now)
			_ = x.Changes()
			_ = px.Changes()
			x.Commit(int64(i))
			px.Commit()
			x, px = tab.Begin(), pen.Begin()
		}
	}
	return nil
}
