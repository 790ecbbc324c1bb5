package main

import (
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/kafkabroker"
	"github.com/tollgate/tollgate/compose/linkproxy"
	"github.com/tollgate/tollgate/compose/natsserver"
	"github.com/tollgate/tollgate/internal/service"
)

// regionsSecret is the key secret of the scenario's gateways (the
// fleet's) and aggregators.
const regionsSecret = "fleet-test-secret-0123456789"

// linkTimeout bounds the wait for the regions' NATS servers to link.
const linkTimeout = 20 * time.Second

// agentPart is what a region runs beside its Redis and gateway when its
// share follows demand: NATS (its own JetStream domain, linked to r1's),
// a Kafka-protocol broker for its gateway's decisions, and an aggregator
// (in this process) counting demand and lending units.
type agentPart struct {
	nats   *natsserver.Server
	kafka  *kafkabroker.Broker
	agg    *aggregator.Server
	cancel context.CancelFunc
	done   chan error // Run's result
}

// stop stops the aggregator (waiting for its Run), then Kafka and NATS.
func (a *agentPart) stop() {
	if a.cancel != nil {
		a.cancel()
		<-a.done
	}
	if a.kafka != nil {
		_ = a.kafka.Stop()
	}
	if a.nats != nil {
		_ = a.nats.Stop()
	}
}

// startLinkedNATS starts one NATS server per region, r1 the hub accepting
// leafnode connections and each other region linking to it through a
// proxy of its own (f.links), and waits until all are linked.
func (f *regionFleet) startLinkedNATS(ctx context.Context, log *slog.Logger) error {
	for i, r := range f.regions {
		opts := []natsserver.Option{natsserver.WithDomain(r.name),
			natsserver.WithStoreDir(filepath.Join(f.dir, "nats-"+r.name)),
			natsserver.WithLogger(log.With(slog.String("region", r.name), slog.String("part", "nats")))}
		if i == 0 {
			opts = append(opts, natsserver.WithLeafnodeListen("127.0.0.1:0"))
		} else {
			p, err := linkproxy.Listen("127.0.0.1:0")
			if err != nil {
				return fmt.Errorf("regions: %s's link: %w", r.name, err)
			}
			f.links = append(f.links, p)
			p.SetTarget(f.regions[0].agent.nats.LeafnodeURL()[len("nats-leaf://"):])
			opts = append(opts, natsserver.WithLeafnodeRemotes("nats-leaf://"+p.Addr()))
		}
		r.agent = &agentPart{}
		var err error
		if r.agent.nats, err = natsserver.Start(ctx, opts...); err != nil {
			return fmt.Errorf("regions: %s's NATS: %w", r.name, err)
		}
	}
	return f.waitLinked(ctx)
}

// waitLinked waits until every region's NATS is linked to r1's.
func (f *regionFleet) waitLinked(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, linkTimeout)
	defer cancel()
	err := service.Poll(ctx, 20*time.Millisecond, func() (bool, error) {
		linked := f.regions[0].agent.nats.Leafnodes() == len(f.regions)-1
		for _, r := range f.regions[1:] {
			linked = linked && r.agent.nats.Leafnodes() == 1
		}
		return linked, nil
	})
	if err != nil {
		return fmt.Errorf("regions: NATS servers not linked within %v: %w", linkTimeout, err)
	}
	return nil
}

// startAgent starts region r's Kafka broker and aggregator (its NATS is
// up) and returns the gateway's environment joining them.
func (f *regionFleet) startAgent(ctx context.Context, r *region, rulesFile string, period, redisTimeout time.Duration, log *slog.Logger) ([]string, error) {
	var err error
	if r.agent.kafka, err = kafkabroker.Start(ctx, kafkabroker.WithListen("127.0.0.1:0"),
		kafkabroker.WithDataDir(filepath.Join(f.dir, "kafka-"+r.name)),
		kafkabroker.WithLogger(log.With(slog.String("region", r.name), slog.String("part", "kafka")))); err != nil {
		return nil, fmt.Errorf("regions: %s's Kafka: %w", r.name, err)
	}
	c := aggregator.Config{
		Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0",
		ID: "agg-" + r.name, Region: r.name, RegionsPeriod: period,
		DataDir:    filepath.Join(f.dir, "aggregator-"+r.name),
		AdminToken: "regions-admin-token-0123456789", KeySecret: regionsSecret,
		RulesFile: rulesFile, SessionTimeout: 6 * time.Second,
	}
	// The scenario's clients run far above L on purpose: the abuse
	// detectors would put their keys on the penalty ladder and measure
	// the penalty, not the regions' shares.
	c.Penalty.Mode = aggregator.PenaltyOff
	c.Kafka.Brokers = r.agent.kafka.Addrs()
	c.NATS.URL = r.agent.nats.ClientURL()
	c.Redis.Addrs = []string{r.redis.Addr()}
	// The gateways' deadline: with the default 50 ms a loaded machine
	// times out the agent's gives and receipts (a give that ran in Redis
	// but timed out keeps its units out of every share until it ends).
	c.Redis.Timeout = redisTimeout
	if r.agent.agg, err = aggregator.New(c, log.With(slog.String("region", r.name), slog.String("part", "aggregator"))); err != nil {
		return nil, fmt.Errorf("regions: %s's aggregator: %w", r.name, err)
	}
	actx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.agent.cancel, r.agent.done = cancel, make(chan error, 1)
	go func() { r.agent.done <- r.agent.agg.Run(actx) }()
	return []string{
		"TOLLGATE_KAFKA_BROKERS=" + r.agent.kafka.Addr(),
		"TOLLGATE_NATS_URL=" + r.agent.nats.ClientURL(),
		"TOLLGATE_REGIONS_PERIOD=" + period.String(),
	}, nil
}
