package aggregator

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// commandPartitioner sends records of the decisions topic (lift commands)
// to the partition they name, and hashes the others' keys.
func commandPartitioner(decisions string) kgo.Partitioner {
	return kgo.BasicConsistentPartitioner(func(topic string) func(*kgo.Record, int) int {
		if topic == decisions {
			return func(r *kgo.Record, n int) int { return int(r.Partition) % n }
		}
		return kgo.StickyKeyPartitioner(nil).ForTopic(topic).Partition
	})
}

// commander writes lift commands into the decisions topic.
type commander struct {
	cl    *kgo.Client
	topic string
}

// Lift writes a KIND_PENALTY_LIFT record for keyID into partition q, with
// the decision stream's codec. A value beyond its bound, or not UTF-8, is
// refused: the partition's owner would refuse the command.
func (c commander) Lift(ctx context.Context, q int32, keyID, tenant, actor, reason string, at time.Time) error {
	for _, s := range [...]string{keyID, tenant, actor, reason} {
		if !utf8.ValidString(s) {
			return errors.New("aggregator: encode lift: a value is not UTF-8")
		}
	}
	v, corrected := tollgatev1.AppendDecision(nil, &tollgatev1.Decision[string]{Partition: q,
		TimeUnixMicros: at.UnixMicro(), Kind: tollgatev1.DecisionEvent_KIND_PENALTY_LIFT, KeyID: keyID, Tenant: tenant,
		CommandActor: actor, CommandReason: reason})
	if corrected != 0 {
		return fmt.Errorf("aggregator: encode lift: %v beyond its bound", corrected)
	}
	if err := c.cl.ProduceSync(ctx, &kgo.Record{Topic: c.topic, Partition: q, Key: []byte(tenant), Value: v}).FirstErr(); err != nil {
		return fmt.Errorf("aggregator: produce lift: %w", err)
	}
	return nil
}
