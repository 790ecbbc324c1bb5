package aggregator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// connectNATS connects to NATS, opens the KV buckets (retrying until
// JetStream answers), seeds the rules bucket from rules_file when it is
// empty, and holds the connection until ctx is done.
func (s *Server) connectNATS(ctx context.Context) error {
	log := s.log.With(slog.String("component", "nats"))
	nc, err := fleetkv.Connect(s.cfg.NATS.URL, fleetkv.Options{Name: "tollgate-aggregator-" + s.cfg.ID, Log: log})
	if err != nil {
		return fmt.Errorf("aggregator: %w", err)
	}
	defer nc.Close()
	s.nc.Store(nc)
	defer s.nc.Store(nil)
	// The links with other regions: answering their global reports, and
	// global changes. They end when this function returns, before the
	// connection closes.
	lctx, stopLinks := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopLinks()
	wg.Go(func() {
		if err := s.serveRegionReports(lctx, nc); err != nil {
			log.Error("answering other regions' reports failed", slog.String("error", err.Error()))
		}
	})
	wg.Go(func() { s.runGlobal(lctx, nc, s.replay) })
	var kv *fleetkv.KV
	for {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		kv, err = fleetkv.Open(octx, nc)
		cancel()
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		log.Warn("NATS JetStream unavailable; the control plane answers 503 until it is", slog.String("error", err.Error()))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
	if err := s.seedRules(ctx, kv); err != nil {
		log.Error("seeding the rules bucket failed", slog.String("error", err.Error()))
	}
	s.kv.Store(kv)
	log.Info("control plane ready", slog.String("nats", fleetkv.RedactURL(s.cfg.NATS.URL)))
	// Follow returns when ctx is done: it holds the connection meanwhile.
	err = nc.Follow(ctx, s.keyControls, keyControlsTick)
	s.kv.Store(nil)
	return err
}

// seedRules writes rules_file as version 1 when the bucket holds no
// ruleset; a concurrent seeder's win is fine.
func (s *Server) seedRules(ctx context.Context, kv *fleetkv.KV) error {
	if s.cfg.RulesFile == "" {
		return nil
	}
	cur, _, err := kv.ActiveRules(ctx)
	if err != nil || cur != nil {
		return err
	}
	src, err := os.ReadFile(s.cfg.RulesFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := rules.Load(src); err != nil {
		return fmt.Errorf("rules_file %s: %w", s.cfg.RulesFile, err)
	}
	e := &tollgatev1.RulesEntry{Version: 1, Source: string(src), Format: "yaml", Actor: "seed:" + s.cfg.ID,
		Reason: "seeded from " + s.cfg.RulesFile, Time: time.Now().UTC()}
	if _, err := kv.PutRules(ctx, e, 0); err != nil {
		if errors.Is(err, fleetkv.ErrConflict) {
			return nil
		}
		return err
	}
	s.log.Info("rules bucket seeded", slog.String("rules_file", s.cfg.RulesFile))
	return audit.NewWriter(s.kafka, s.cfg.Kafka.AuditTopic).Write(ctx, &tollgatev1.AuditEntry{Actor: e.Actor, Kind: audit.KindRules,
		Subject: "rules", Reason: e.Reason, Version: 1, Before: []byte(`{"version":0}`), After: mustJSON(map[string]any{"version": 1})})
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}
