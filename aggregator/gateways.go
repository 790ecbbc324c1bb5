package aggregator

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/internal/fleetkv"
)

// gatewaysReadTimeout bounds reading the presence bucket and the active
// ruleset.
const gatewaysReadTimeout = 2 * time.Second

// gatewayRow is a gateway as GET /admin/v1/gateways lists it.
type gatewayRow struct {
	ID           string `json:"id"`
	Region       string `json:"region"`
	RulesVersion int64  `json:"rules_version"`
	RulesSource  string `json:"rules_source"`
	// Current: the gateway runs the active rules version.
	Current    bool    `json:"current"`
	Build      string  `json:"build"`
	StartedAt  string  `json:"started_at"`
	LastSeen   string  `json:"last_seen"`
	AgeSeconds float64 `json:"age_seconds"`
	// Stale: not heard from for fleetkv.StaleAfter (three heartbeats).
	Stale bool `json:"stale"`
}

// gatewaysBody is GET /admin/v1/gateways' answer, and the overview's
// gateways.
type gatewaysBody struct {
	Time string `json:"time"`
	// RulesVersion is the active version in the rules bucket (0: none).
	RulesVersion int64 `json:"rules_version"`
	Count        int   `json:"count"`
	// Current counts the gateways on RulesVersion.
	Current int `json:"current"`
	// Corrupt counts the entries skipped because they do not decode or
	// sit under another gateway's key.
	Corrupt  int          `json:"corrupt_entries"`
	Gateways []gatewayRow `json:"gateways"`
}

// readGateways reads the gateways' presence entries and the active rules
// version; when NATS is not configured or not reached it returns the
// error code and message to answer instead.
func (s *Server) readGateways(ctx context.Context, now time.Time) (body gatewaysBody, code, msg string) {
	if s.cfg.NATS.URL == "" {
		return body, apierror.NATSNotConfigured, "the gateways announce themselves through NATS, and this aggregator has no " +
			"TOLLGATE_NATS_URL"
	}
	kv := s.natsKV()
	if kv == nil {
		return body, apierror.NATSUnavailable, "NATS JetStream is not reached (yet)"
	}
	ctx, cancel := context.WithTimeout(ctx, gatewaysReadTimeout)
	defer cancel()
	// A corrupt active entry is no error here: the gateways then run the
	// newest good version, and none counts as current.
	active, _, err := kv.ActiveRules(ctx)
	if err != nil && !errors.Is(err, fleetkv.ErrCorrupt) {
		return body, apierror.NATSUnavailable, "reading the active ruleset: " + err.Error()
	}
	seen, corrupt, err := kv.Gateways(ctx)
	if err != nil {
		return body, apierror.NATSUnavailable, "reading the gateways: " + err.Error()
	}
	if len(corrupt) > 0 {
		// Debug: the console reads this every 2 s; the answer counts them.
		s.log.Debug("presence entries that do not decode are skipped", slog.Int("corrupt_entries", len(corrupt)),
			slog.String("first_key", corrupt[0].Key), slog.String("error", corrupt[0].Err.Error()))
	}
	body = gatewaysBody{Time: now.UTC().Format(time.RFC3339), Corrupt: len(corrupt), Gateways: []gatewayRow{}}
	if active != nil {
		body.RulesVersion = active.Version
	}
	for _, g := range seen {
		e, age := g.Entry, max(0, now.Sub(g.Stored))
		row := gatewayRow{ID: e.GatewayID, Region: e.Region, RulesVersion: e.RulesVersion, RulesSource: e.RulesSource,
			Current: active != nil && e.RulesVersion == active.Version, Build: e.Build,
			LastSeen: g.Stored.UTC().Format(time.RFC3339), AgeSeconds: age.Round(100 * time.Millisecond).Seconds(),
			Stale: age > fleetkv.StaleAfter}
		if !e.StartedAt.IsZero() {
			row.StartedAt = e.StartedAt.UTC().Format(time.RFC3339)
		}
		if row.Current {
			body.Current++
		}
		body.Gateways = append(body.Gateways, row)
	}
	slices.SortFunc(body.Gateways, func(a, b gatewayRow) int { return cmp.Compare(a.ID, b.ID) })
	body.Count = len(body.Gateways)
	return body, "", ""
}

// gateways is GET /admin/v1/gateways: the gateways in fleet mode that
// announce themselves in the presence bucket, with the rules version each
// runs and whether it is the active one, and when each was last heard
// from.
func (s *Server) gateways(w http.ResponseWriter, r *http.Request) {
	body, code, msg := s.readGateways(r.Context(), time.Now())
	if code != "" {
		unavailable(w, code, msg)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(&body)
}
