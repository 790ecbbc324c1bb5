package aggregator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

// hashedGuard is a guard for one ruleset.
type hashedGuard struct {
	hash string
	g    *guard.Guard
}

// keyGuard returns a guard with the fleet's active ruleset (the rules
// bucket, else rules_file) over the gateways' Redis, for the operator
// API's keys/{key} routes, under the fleet's overrides and penalties
// (keyControls). It is rebuilt when the ruleset changes.
func (s *Server) keyGuard(ctx context.Context) (*guard.Guard, error) {
	var src []byte
	if kv := s.kv.Load(); kv != nil {
		e, _, err := kv.ActiveRules(ctx)
		if err != nil {
			return nil, err
		}
		if e != nil {
			src = []byte(e.Source)
		}
	}
	if src == nil && s.cfg.RulesFile != "" {
		b, err := os.ReadFile(s.cfg.RulesFile)
		if err != nil {
			return nil, fmt.Errorf("rules_file: %w", err)
		}
		src = b
	}
	if src == nil {
		return nil, errors.New("no ruleset: the rules bucket is empty and rules_file is not set")
	}
	rs, err := rules.Load(src)
	if err != nil {
		return nil, err
	}
	if cur := s.keyGard.Load(); cur != nil && cur.hash == rs.Hash() {
		return cur.g, nil
	}
	g, err := guard.New(s.store, []byte(s.cfg.KeySecret), rs,
		guard.WithLogger(s.log.With(slog.String("component", "guard"))), guard.WithRegion(s.cfg.Region), guard.WithRegionsPeriod(s.cfg.RegionsPeriod),
		guard.WithControls(s.keyControls.c))
	if err != nil {
		return nil, err
	}
	s.keyGard.Store(&hashedGuard{hash: rs.Hash(), g: g})
	return g, nil
}
