package reports

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"
)

// ownReport is a report handler answering one row, as a region's own
// report would.
var ownReport = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("regions") {
		http.Error(w, "regions reached the local report", http.StatusInternalServerError)
		return
	}
	_ = json.NewEncoder(w).Encode(Answer{Tenant: "acme", Rows: []Row{{WindowStart: "w1", KeyID: "k", Endpoint: "/", Allowed: 2, Rejected: 1, Cost: 3}},
		Totals: Totals{Allowed: 2, Rejected: 1, Cost: 3}})
})

func reply(allowed int64) RegionReply {
	b, _ := json.Marshal(Answer{Rows: []Row{{WindowStart: "w1", KeyID: "k", Endpoint: "/", Allowed: allowed, Cost: allowed}},
		Totals: Totals{Allowed: allowed, Cost: allowed}})
	return RegionReply{Status: 200, Body: b}
}

func TestGlobalReport(t *testing.T) {
	t.Parallel()
	type asked func(ctx context.Context, region string, req RegionRequest) (RegionReply, error)
	answers := func(status int, allowed int64) asked {
		return func(context.Context, string, RegionRequest) (RegionReply, error) {
			r := reply(allowed)
			r.Status = status
			return r, nil
		}
	}
	hang := func(ctx context.Context, _ string, _ RegionRequest) (RegionReply, error) {
		<-ctx.Done()
		return RegionReply{}, ctx.Err()
	}
	tests := []struct {
		name        string
		regions     []string
		ask         asked
		query       string
		wantStatus  int
		wantAllowed int64
		wantMissing []string
	}{
		{"no regions list: own report", nil, nil, "regions=all", 200, 2, []string{}},
		{"two regions summed", []string{"eu", "us"}, answers(200, 5), "regions=all", 200, 7, []string{}},
		{"region not ready", []string{"eu", "us"}, answers(503, 5), "regions=all", 200, 2, []string{"us"}},
		{"region hangs past the timeout", []string{"eu", "us", "ap"}, hang, "regions=all", 200, 2, []string{"us", "ap"}},
		{"no link", []string{"eu", "us"}, nil, "regions=all", 200, 2, []string{"us"}},
		{"unknown value", []string{"eu", "us"}, nil, "regions=us", 400, 0, nil},
		{"empty value", []string{"eu", "us"}, nil, "regions=", 400, 0, nil},
		{"a cursor", []string{"eu", "us"}, nil, "regions=all&cursor=x", 400, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := WithRegions(ownReport, RegionsConfig{Region: "eu", Timeout: 200 * time.Millisecond,
				Regions: func(context.Context) ([]string, error) { return tt.regions, nil }, Ask: tt.ask})
			w := httptest.NewRecorder()
			h.ServeHTTP(w, httptest.NewRequest("GET", "/v1/usage/tenants/acme?"+tt.query, nil))
			if w.Code != tt.wantStatus {
				t.Fatalf("status %d, want %d: %s", w.Code, tt.wantStatus, w.Body)
			}
			if tt.wantStatus != 200 {
				if !strings.Contains(w.Body.String(), "INVALID_REQUEST") {
					t.Errorf("body %s, want INVALID_REQUEST", w.Body)
				}
				return
			}
			var a RegionsAnswer
			if err := json.Unmarshal(w.Body.Bytes(), &a); err != nil {
				t.Fatal(err)
			}
			if a.Totals.Allowed != tt.wantAllowed || !slices.Equal(a.MissingRegions, tt.wantMissing) {
				t.Errorf("allowed %d missing %v, want %d %v: %s", a.Totals.Allowed, a.MissingRegions, tt.wantAllowed, tt.wantMissing, w.Body)
			}
			if got, want := w.Header().Get(MissingRegionsHeader), strings.Join(tt.wantMissing, ","); got != want {
				t.Errorf("%s: %q, want %q", MissingRegionsHeader, got, want)
			}
		})
	}
}

func TestMerge(t *testing.T) {
	t.Parallel()
	a := Answer{Rows: []Row{{WindowStart: "w2", KeyID: "k", Endpoint: "/", Allowed: 1}, {WindowStart: "w1", KeyID: "k", Endpoint: "/", Allowed: 2}},
		Totals: Totals{Allowed: 3}}
	b := Answer{Rows: []Row{{WindowStart: "w1", KeyID: "k", Endpoint: "/", Allowed: 4, KeyPrefix: "sk_"}, {WindowStart: "w1", KeyID: "j", Endpoint: "/", Allowed: 8}},
		Totals: Totals{Allowed: 12}, NextCursor: "more"}
	tests := []struct {
		name      string
		parts     []Answer
		limit     int
		wantRows  []Row
		wantTrunc bool
	}{
		{"none", nil, 10, []Row{}, false},
		{"one", []Answer{a}, 10, []Row{a.Rows[1], a.Rows[0]}, false},
		{"summed and ordered", []Answer{a, b}, 10, []Row{
			{WindowStart: "w1", KeyID: "j", Endpoint: "/", Allowed: 8},
			{WindowStart: "w1", KeyID: "k", Endpoint: "/", Allowed: 6, KeyPrefix: "sk_"},
			{WindowStart: "w2", KeyID: "k", Endpoint: "/", Allowed: 1}}, true},
		{"cut at the limit", []Answer{a}, 1, []Row{a.Rows[1]}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rows, tot, trunc := Merge(tt.parts, tt.limit)
			if !slices.Equal(rows, tt.wantRows) || trunc != tt.wantTrunc {
				t.Errorf("rows %v truncated %v, want %v %v", rows, trunc, tt.wantRows, tt.wantTrunc)
			}
			var want int64
			for _, p := range tt.parts {
				want += p.Totals.Allowed
			}
			if tot.Allowed != want {
				t.Errorf("total %d, want %d", tot.Allowed, want)
			}
		})
	}
}

// TestServeLocalFits: an answer larger than a message is asked again with
// fewer rows, its totals whole.
func TestServeLocalFits(t *testing.T) {
	t.Parallel()
	many := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := 100
		if s := r.URL.Query().Get("limit"); s != "" {
			n = len(s) // "50" → 2: enough to see the limit applied
		}
		a := Answer{Totals: Totals{Allowed: 100}}
		for range n {
			a.Rows = append(a.Rows, Row{KeyID: strings.Repeat("k", 50), Allowed: 1})
		}
		a.NextCursor = "c"
		_ = json.NewEncoder(w).Encode(a)
	})
	rep := ServeLocal(context.Background(), many, RegionRequest{Path: "/v1/usage/tenants/acme"}, 2000)
	var a Answer
	if rep.Status != 200 || json.Unmarshal(rep.Body, &a) != nil || len(rep.Body) > 2000 || a.Totals.Allowed != 100 {
		t.Fatalf("ServeLocal: %d, %d bytes, %d rows, totals %v", rep.Status, len(rep.Body), len(a.Rows), a.Totals)
	}
	if rep := ServeLocal(context.Background(), many, RegionRequest{Path: "/admin/v1/rules"}, 0); rep.Status != 400 {
		t.Errorf("a path outside the reports: %d, want 400", rep.Status)
	}
}

func FuzzServeLocal(f *testing.F) {
	f.Add("/v1/usage/tenants/acme", "granularity=hour&regions=all")
	f.Add("/v1/usage/keys/kid:x", "%zz")
	f.Add("/admin/v1/rules", "")
	f.Fuzz(func(t *testing.T, path, query string) {
		rep := ServeLocal(context.Background(), ownReport, RegionRequest{Path: path, Query: query}, 1<<10)
		if !json.Valid(rep.Body) || rep.Status == 0 {
			t.Fatalf("ServeLocal(%q, %q): %d %q", path, query, rep.Status, rep.Body)
		}
	})
}
