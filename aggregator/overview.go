package aggregator

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/guard/apierror"
)

// overview bounds.
const (
	overviewMaxMinutes = 60
	overviewMaxLimit   = 100
	// overviewMaxPenalties bounds the penalised keys listed.
	overviewMaxPenalties = 200
	// overviewMaxGateways bounds the gateways listed (all are counted):
	// the most recently heard from.
	overviewMaxGateways = 100
)

// overviewTotals are decisions over the overview's span.
type overviewTotals struct {
	Allowed            int64   `json:"allowed"`
	Rejected           int64   `json:"rejected"`
	DecisionsPerSecond float64 `json:"decisions_per_second"`
	RejectionRate      float64 `json:"rejection_rate"`
}

type overviewKey struct {
	Tenant    string `json:"tenant"`
	KeyID     string `json:"key_id"`
	KeyPrefix string `json:"key_prefix"`
	Allowed   int64  `json:"allowed"`
	Rejected  int64  `json:"rejected"`
}

type overviewTenant struct {
	Tenant   string `json:"tenant"`
	Allowed  int64  `json:"allowed"`
	Rejected int64  `json:"rejected"`
}

type overviewPenalty struct {
	Tenant    string `json:"tenant"`
	KeyID     string `json:"key_id"`
	KeyPrefix string `json:"key_prefix"`
	Level     int    `json:"level"`
	Since     string `json:"since"`
	ExpiresAt string `json:"expires_at"`
}

// overviewBody is GET /admin/v1/overview's answer.
type overviewBody struct {
	Time    string `json:"time"`
	From    string `json:"from"`
	Minutes int    `json:"minutes"`
	// Health is what /readyz says; Ready its verdict.
	Health     readiness         `json:"health"`
	Ready      bool              `json:"ready"`
	KafkaLag   int64             `json:"kafka_lag"`
	Traffic    overviewTotals    `json:"traffic"`
	TopKeys    []overviewKey     `json:"top_keys"`
	TopTenants []overviewTenant  `json:"top_tenants"`
	Levels     map[string]int    `json:"penalty_levels"`
	Penalties  []overviewPenalty `json:"penalties"`
	// Gateways is GET /admin/v1/gateways' answer, its list cut to the
	// overviewMaxGateways most recently heard from; null when NATS is not
	// configured or not reached.
	Gateways *gatewaysBody `json:"gateways"`
}

// overview is GET /admin/v1/overview?minutes=&limit=: what the console's
// overview shows, in one read of this instance's state — decisions in
// the last minutes (the open minute included) with the keys and tenants
// most rejected, the penalties in force by level, the consumer lag,
// /readyz's health and the gateways with their rules version. While the state is restoring, the figures are
// partial and health.state says so.
func (s *Server) overview(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	minutes, limit := 5, 10
	for name, dst := range map[string]struct {
		v   *int
		max int
	}{"minutes": {&minutes, overviewMaxMinutes}, "limit": {&limit, overviewMaxLimit}} {
		if v := q.Get(name); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 || n > dst.max {
				apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, name+": 1 to "+strconv.Itoa(dst.max))
				return
			}
			*dst.v = n
		}
	}
	now := time.Now()
	from := now.Truncate(time.Minute).Add(-time.Duration(minutes-1) * time.Minute)
	body := overviewBody{Time: now.UTC().Format(time.RFC3339), From: from.UTC().Format(time.RFC3339), Minutes: minutes,
		TopKeys: []overviewKey{}, TopTenants: []overviewTenant{}, Levels: map[string]int{"1": 0, "2": 0, "3": 0},
		Penalties: []overviewPenalty{}}
	body.Health, body.Ready = s.readiness(now)
	body.KafkaLag = s.consumerLag()

	keys, err := s.db.Recent(from.Unix(), now.Add(time.Minute).Unix())
	if err != nil {
		apierror.Write(w, http.StatusInternalServerError, apierror.Internal, "reading the usage rows failed")
		return
	}
	tenants := map[string]*overviewTenant{}
	for _, k := range keys {
		body.Traffic.Allowed += k.Allowed
		body.Traffic.Rejected += k.Rejected
		t := tenants[k.Tenant]
		if t == nil {
			t = &overviewTenant{Tenant: k.Tenant}
			tenants[k.Tenant] = t
		}
		t.Allowed += k.Allowed
		t.Rejected += k.Rejected
		if k.Rejected > 0 {
			body.TopKeys = append(body.TopKeys, overviewKey{Tenant: k.Tenant, KeyID: k.KeyID, KeyPrefix: k.KeyPrefix,
				Allowed: k.Allowed, Rejected: k.Rejected})
		}
	}
	if n := body.Traffic.Allowed + body.Traffic.Rejected; n > 0 {
		body.Traffic.RejectionRate = float64(body.Traffic.Rejected) / float64(n)
		body.Traffic.DecisionsPerSecond = float64(n) / max(1, now.Sub(from).Seconds())
	}
	slices.SortFunc(body.TopKeys, func(a, b overviewKey) int {
		return cmp.Or(cmp.Compare(b.Rejected, a.Rejected), cmp.Compare(a.KeyID, b.KeyID))
	})
	body.TopKeys = body.TopKeys[:min(limit, len(body.TopKeys))]
	for _, t := range tenants {
		if t.Rejected > 0 {
			body.TopTenants = append(body.TopTenants, *t)
		}
	}
	slices.SortFunc(body.TopTenants, func(a, b overviewTenant) int {
		return cmp.Or(cmp.Compare(b.Rejected, a.Rejected), cmp.Compare(a.Tenant, b.Tenant))
	})
	body.TopTenants = body.TopTenants[:min(limit, len(body.TopTenants))]

	nowMicros := now.UnixMicro()
	err = s.db.EachPenalty(func(_ int32, keyID string, st abuse.State) error {
		if !st.Enforced(nowMicros) {
			return nil
		}
		body.Levels[strconv.Itoa(st.Level)]++
		if len(body.Penalties) < overviewMaxPenalties {
			body.Penalties = append(body.Penalties, overviewPenalty{Tenant: st.Tenant, KeyID: keyID, KeyPrefix: st.KeyPrefix,
				Level: st.Level, Since: time.UnixMicro(st.Since).UTC().Format(time.RFC3339),
				ExpiresAt: time.UnixMicro(st.Until).UTC().Format(time.RFC3339)})
		}
		return nil
	})
	if err != nil {
		apierror.Write(w, http.StatusInternalServerError, apierror.Internal, "reading the penalty states failed")
		return
	}
	slices.SortFunc(body.Penalties, func(a, b overviewPenalty) int {
		return cmp.Or(cmp.Compare(b.Level, a.Level), cmp.Compare(a.KeyID, b.KeyID))
	})
	if gws, code, _ := s.readGateways(r.Context(), now); code == "" {
		if len(gws.Gateways) > overviewMaxGateways {
			slices.SortStableFunc(gws.Gateways, func(a, b gatewayRow) int { return cmp.Compare(a.AgeSeconds, b.AgeSeconds) })
			gws.Gateways = gws.Gateways[:overviewMaxGateways]
			slices.SortFunc(gws.Gateways, func(a, b gatewayRow) int { return cmp.Compare(a.ID, b.ID) })
		}
		body.Gateways = &gws
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(&body)
}

// consumerLag sums the consumer lag this instance exports
// (tollgate_aggregator_consumer_lag, one series per owned partition).
func (s *Server) consumerLag() int64 {
	mfs, err := s.reg.Gather()
	if err != nil {
		return 0
	}
	var lag float64
	for _, mf := range mfs {
		if mf.GetName() != "tollgate_aggregator_consumer_lag" {
			continue
		}
		for _, m := range mf.GetMetric() {
			lag += m.GetGauge().GetValue()
		}
	}
	return int64(lag)
}
