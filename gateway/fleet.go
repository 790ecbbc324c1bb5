package gateway

import (
	"context"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tollgate/tollgate/gateway/internal/rulefile"
	"github.com/tollgate/tollgate/gateway/internal/rulesync"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// natsStartWait is how long Run waits for NATS at start, in fleet mode,
// before serving: long enough for a reachable NATS to deliver the fleet's
// rules first, short enough that an outage delays nothing much. Without an
// answer the gateway serves the last-known-good copy's rules, or
// rules_file's, and switches when NATS answers.
const natsStartWait = time.Second

// presencePokeSpread bounds the random delay of the presence write after
// a ruleset is put in force (fleetkv.AnnouncerConfig.PokeSpread): the
// gateways of a fleet all put it in force at the same instant, and 200
// writes at that instant doubled the time the change took to reach the
// last of 200 gateways.
const presencePokeSpread = 500 * time.Millisecond

// presencePokeEvery quiets the presence writes after new rulesets
// (fleetkv.AnnouncerConfig.PokeEvery): after three within 15 s, the
// rulesets of the next 15 to 30 s are reported by the 5 s heartbeat.
// Rulesets put in force in quick succession (a rollout script's) made the
// 200 gateways of a fleet write together after each, and those bursts of
// writes delayed the next change's delivery to the last gateways several
// times over.
const presencePokeEvery = 3 * fleetkv.DefaultHeartbeat

var _ rulesSource = (*rulesync.Syncer)(nil)

// startRules loads the rules the gateway starts with. Static mode:
// rules_file, watched. Fleet mode (nats.url set): the last-known-good copy
// when there is one (its blocklist and overrides too), else rules_file;
// then the NATS KV buckets once they answer. The log says which.
func (s *Server) startRules() error {
	cfg := s.cfg
	var rs *rulefile.Ruleset
	source := sourceFile
	if cfg.NATS.URL != "" {
		announcer, err := fleetkv.NewAnnouncer(fleetkv.AnnouncerConfig{ID: cfg.GatewayID, Entry: s.presence,
			PokeSpread: presencePokeSpread, PokeEvery: presencePokeEvery, Log: s.log.With(slog.String("component", "presence"))})
		if err != nil {
			return err
		}
		s.announcer = announcer
		sy, err := rulesync.New(rulesync.Config{
			URL:       cfg.NATS.URL,
			Name:      "tollgate-gateway-" + cfg.GatewayID,
			Dir:       cfg.StateDir(),
			Controls:  s.guard.Controls(),
			Apply:     s.applyFromNATS,
			Check:     s.guard.CheckRules,
			OnRefused: func(error) { s.m.ReloadError() },
			// A reset or quota grant from the operator API: what the fast
			// path holds of those counters is stale.
			OnCountersChanged: s.guard.ForgetNames,
			Announcer:         announcer,
			Log:               s.log.With(slog.String("component", "rulesync")),
		})
		if err != nil {
			return err
		}
		s.sync, s.rules = sy, sy
		lkg, err := sy.LoadLKG()
		switch {
		case err != nil:
			s.log.Error("fleet mode: the last-known-good copy is unreadable; starting from rules_file until NATS answers",
				slog.String("error", err.Error()), slog.String("rules_file", cfg.RulesFile))
		case lkg != nil && lkg.Rules != nil:
			rs, source = lkg.Rules, sourceLKG
			s.log.Info("fleet mode: starting from the last-known-good copy until NATS answers",
				slog.String("path", lkg.Path), slog.Time("saved_at", lkg.SavedAt), slog.String("rules_version", rs.Version()),
				slog.Int("controls", lkg.Entries))
		case lkg != nil:
			s.log.Info("fleet mode: the last-known-good copy holds no ruleset; starting from rules_file (and the copy's blocklist and overrides) until NATS answers",
				slog.String("path", lkg.Path), slog.String("rules_file", cfg.RulesFile), slog.Int("controls", lkg.Entries))
		default:
			s.log.Info("fleet mode: no last-known-good copy yet; starting from rules_file until NATS answers",
				slog.String("dir", cfg.StateDir()), slog.String("rules_file", cfg.RulesFile))
		}
	}
	if rs == nil {
		var err error
		if rs, err = rulefile.Load(cfg.RulesFile); err != nil {
			return err
		}
		if err := s.guard.CheckRules(rs.Rules); err != nil {
			return err
		}
	}
	s.setRules(rs, source, false)
	if s.sync == nil {
		s.rules = rulefile.NewWatcher(cfg.RulesFile, rs, func(rs *rulefile.Ruleset) { s.setRules(rs, sourceFile, true) },
			rulefile.WithLogger(s.log.With(slog.String("component", "rulefile"))),
			rulefile.WithCheck(s.guard.CheckRules),
			rulefile.OnRefused(func(error) { s.m.ReloadError() }))
	}
	return nil
}

// applyFromNATS puts a ruleset from NATS in force. The ruleset already in
// force (the last-known-good copy's, confirmed by NATS after a resync)
// only changes its source: the guard keeps it, and with it its caches.
func (s *Server) applyFromNATS(rs *rulefile.Ruleset) {
	if cur := s.ruleState.Load(); cur != nil && cur.Ruleset == rs {
		if cur.source != sourceNATS {
			s.ruleState.Store(&activeRules{Ruleset: rs, source: sourceNATS})
			s.log.Info("rules in force confirmed by NATS", slog.String("version", rs.Version()))
			s.announcer.Poke()
		}
		return
	}
	s.setRules(rs, sourceNATS, true)
}

// presence is the gateway's entry in the presence bucket
// (tollgate_gateways), which fleetkv.Announcer writes at start, after
// every ruleset put in force (setRules pokes it) and every
// fleetkv.DefaultHeartbeat. It reads atomics only, and holds no API key.
func (s *Server) presence() tollgatev1.GatewayEntry {
	e := tollgatev1.GatewayEntry{Region: s.cfg.Region, Build: buildVersion(), StartedAt: s.started.UTC()}
	if cur := s.ruleState.Load(); cur != nil {
		e.RulesVersion, e.RulesHash, e.RulesSource = cur.Rules.Version(), cur.Version(), cur.source
	}
	if s.sync != nil {
		e.NATSSynced = s.sync.Status().Synced
	}
	return e
}

// buildVersion is the binary's module version and VCS revision, as the Go
// toolchain recorded them ("(devel)" for a plain go build).
var buildVersion = sync.OnceValue(func() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return ""
	}
	v := bi.Main.Version
	for _, st := range bi.Settings {
		if st.Key == "vcs.revision" && len(st.Value) >= 12 {
			v += " " + st.Value[:12]
		}
	}
	return v
})

// waitForNATS waits, at most natsStartWait, for the first complete read of
// the buckets, and says what the gateway serves when they did not answer.
func (s *Server) waitForNATS(ctx context.Context) {
	t := time.NewTimer(natsStartWait)
	defer t.Stop()
	select {
	case <-s.sync.Synced():
	case <-ctx.Done():
	case <-t.C:
		cur := s.ruleState.Load()
		s.log.Warn("fleet mode: NATS has not answered; serving the rules in force until it does",
			slog.Duration("waited", natsStartWait), slog.String("rules_source", cur.source), slog.String("rules_version", cur.Version()))
	}
}

// controlsCollector exports the number of controls in force, by kind, read
// at scrape time:
//
//	tollgate_controls_entries{kind="blocked"} 3
//
// kind is one of blocked, allowed, penalty, key_override, tenant_override.
// Expired entries count until the sweep (every 5 s) drops them.
type controlsCollector struct {
	controls     *guard.Controls
	desc, levels *prometheus.Desc
}

var _ prometheus.Collector = (*controlsCollector)(nil)

func newControlsCollector(c *guard.Controls) *controlsCollector {
	return &controlsCollector{controls: c, desc: prometheus.NewDesc("tollgate_controls_entries",
		"Controls in force (blocklist, allowlist, penalties, overrides; in fleet mode from NATS), by kind: blocked, allowed, penalty, key_override or tenant_override.",
		[]string{"kind"}, nil),
		levels: prometheus.NewDesc("tollgate_penalized_keys",
			"Keys the penalty ladder holds at each level now, as this gateway enforces them: 1 (reduced limit: an override), 2 (cooldown: 429 PENALTY), 3 (blocklist: 403, connection closed). Expired entries do not count.",
			[]string{"level"}, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *controlsCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc; ch <- c.levels }

// Collect implements prometheus.Collector.
func (c *controlsCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.controls.Snapshot()
	for _, k := range []struct {
		kind string
		n    int
	}{{"blocked", len(s.Blocked)}, {"allowed", len(s.Allowed)}, {"penalty", len(s.Penalties)},
		{"key_override", len(s.KeyOverrides)}, {"tenant_override", len(s.TenantOverrides)}} {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(k.n), k.kind)
	}
	var levels [tollgatev1.MaxLevel + 1]int
	now := time.Now().UnixMicro()
	count := func(level int, expiry int64) {
		if level > 0 && level <= tollgatev1.MaxLevel && (expiry == 0 || expiry > now) {
			levels[level]++
		}
	}
	for _, o := range s.KeyOverrides {
		count(o.Level, o.Expiry)
	}
	for _, p := range s.Penalties {
		count(p.Level, p.Until)
	}
	for _, e := range s.Blocked {
		count(e.Level, e.Expiry)
	}
	for level := 1; level <= tollgatev1.MaxLevel; level++ {
		ch <- prometheus.MustNewConstMetric(c.levels, prometheus.GaugeValue, float64(levels[level]), strconv.Itoa(level))
	}
}

// fleetCollectors are the fleet mode's gauges, read from the Syncer at
// scrape time.
func (s *Server) fleetCollectors() []prometheus.Collector {
	var corrupt []prometheus.Collector
	for _, bucket := range []string{tollgatev1.BucketRules, tollgatev1.BucketBlocklist, tollgatev1.BucketOverrides} {
		corrupt = append(corrupt, prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "tollgate_nats_corrupt_entries",
			Help:        "Entries of the NATS KV bucket that do not decode or sit under the wrong key, as the gateway last read them (every gateway treats them alike: a corrupt blocklist entry blocks its key_id, a corrupt override or allowlisting applies nowhere, a corrupt ruleset leaves the newest good one in force). Repair them through the operator API.",
			ConstLabels: prometheus.Labels{"bucket": bucket},
		}, func() float64 { return float64(s.sync.Status().Corrupt[bucket]) }))
	}
	return append(corrupt,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tollgate_nats_connected",
			Help: "1 while the gateway is connected to NATS (fleet mode), else 0: the rules and controls in force stay meanwhile.",
		}, func() float64 {
			if s.sync.Status().Connected {
				return 1
			}
			return 0
		}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tollgate_nats_last_change_timestamp_seconds",
			Help: "Unix time the gateway last applied a change from NATS KV (a ruleset, a blocklist entry, an override, or a whole resync); 0 before the first.",
		}, func() float64 {
			t := s.sync.Status().LastApplied
			if t.IsZero() {
				return 0
			}
			return float64(t.UnixMilli()) / 1e3
		}),
	)
}
