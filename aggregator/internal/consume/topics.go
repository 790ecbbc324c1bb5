package consume

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// setup creates missing topics and checks Pebble's identity against the
// cluster and changelog topic; it returns the changelog's partitions.
func (p *Processor) setup(ctx context.Context, adm *kadm.Client) (map[int32]bool, error) {
	t := p.cfg.Topics
	meta, err := p.awaitMetadata(ctx, adm)
	if err != nil {
		return nil, err
	}
	n := p.cfg.Partitions
	if d, ok := meta.Topics[t.Decisions]; ok && d.Err == nil && len(d.Partitions) > 0 {
		n = int32(len(d.Partitions))
	}
	// The broker's clock stamps decision records, so that no writer
	// chooses the time event times are checked against.
	logAppend, compact, forever := "LogAppendTime", "compact", "-1"
	for _, c := range []struct {
		topic   string
		configs map[string]*string
	}{
		{t.Decisions, map[string]*string{"message.timestamp.type": &logAppend}},
		{t.Changelog, map[string]*string{"cleanup.policy": &compact}},
		{t.Usage, nil},
		{t.Penalties, nil},
		{t.Audit, map[string]*string{"retention.ms": &forever}},
	} {
		if err := createMissing(ctx, adm, meta, n, c.topic, c.configs); err != nil {
			return nil, err
		}
	}
	if meta, err = p.awaitPartitions(ctx, adm); err != nil {
		return nil, err
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

// awaitMetadata reads the metadata of the processor's topics, retrying
// every second for as long as ctx lasts (Health says why meanwhile).
func (p *Processor) awaitMetadata(ctx context.Context, adm *kadm.Client) (kadm.Metadata, error) {
	t := p.cfg.Topics
	for attempt := 0; ; attempt++ {
		meta, err := adm.Metadata(ctx, t.Decisions, t.Changelog, t.Usage, t.Penalties, t.Audit)
		if err == nil {
			p.setStage(StageStarting, nil)
			return meta, nil
		}
		if ctx.Err() != nil {
			return kadm.Metadata{}, fmt.Errorf("consume: kafka metadata: %w", err)
		}
		// Kafka may be down for long: say so once, then every 30 tries.
		p.setStage(StageStarting, err)
		if attempt%30 == 0 {
			p.log.Warn("kafka unreachable; retrying every second", slog.String("error", err.Error()))
		}
		select {
		case <-ctx.Done():
			return kadm.Metadata{}, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// createMissing creates topic with n partitions unless meta lists it (or
// it is not configured); another instance creating it first is fine.
func createMissing(ctx context.Context, adm *kadm.Client, meta kadm.Metadata, n int32, topic string, configs map[string]*string) error {
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

// awaitPartitions reads the decisions and changelog topics' metadata
// until both show partitions (a topic just created may show none for a
// moment), for about five seconds at most.
func (p *Processor) awaitPartitions(ctx context.Context, adm *kadm.Client) (kadm.Metadata, error) {
	t := p.cfg.Topics
	for attempt := 0; ; attempt++ {
		meta, err := adm.Metadata(ctx, t.Decisions, t.Changelog)
		if err != nil {
			return kadm.Metadata{}, fmt.Errorf("consume: kafka metadata: %w", err)
		}
		if len(meta.Topics[t.Changelog].Partitions) > 0 && len(meta.Topics[t.Decisions].Partitions) > 0 || attempt == 50 {
			return meta, nil
		}
		select {
		case <-ctx.Done():
			return kadm.Metadata{}, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
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
