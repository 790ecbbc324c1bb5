package aggregator_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/tollgate/tollgate/aggregator"
	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/compose/redisserver/redistest"
	"github.com/tollgate/tollgate/internal/testwait"
)

const twoRegions = `
regions:
  - {name: eu}
  - {name: us}
rules:
  - {id: default, algorithm: token_bucket, capacity: 10, rate: 10/1m, regions: global}
`

// regionAggregator starts an aggregator of region on its own Kafka and
// Redis, with the NATS at natsURL.
func regionAggregator(t *testing.T, region, natsURL string) (*instance, []string) {
	t.Helper()
	brokers := startKafka(t)
	cfg := testConfig(brokers, "agg-"+region, t.TempDir())
	cfg.Region = region
	cfg.NATS.URL = natsURL
	cfg.Redis.Addrs = []string{redistest.StartTB(t).Addr()}
	return runAggregator(t, cfg), brokers
}

type globalAnswer struct {
	Rows []struct {
		KeyID             string `json:"key_id"`
		Allowed, Rejected int64
	} `json:"rows"`
	Totals struct {
		Allowed, Rejected, Cost int64
	} `json:"totals"`
	Regions        []string `json:"regions"`
	MissingRegions []string `json:"missing_regions"`
}

// globalReport asks addr for tenant's report with the query given.
func globalReport(addr, tenant string, q url.Values) (int, http.Header, []byte, error) {
	q.Set("granularity", "minute")
	q.Set("from", time.Now().Add(-time.Hour).Format(time.RFC3339))
	q.Set("to", time.Now().Add(time.Minute).Format(time.RFC3339))
	req, _ := http.NewRequest("GET", "http://"+addr+"/v1/usage/tenants/"+url.PathEscape(tenant)+"?"+q.Encode(), nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b, err
}

// TestGlobalUsageReport: two regions, each its own NATS (its own
// JetStream domain, linked by a leafnode), Kafka, Redis and aggregator.
// ?regions=all on either sums both regions' decisions; with the link cut,
// and with one region's aggregator gone, the answer comes promptly, names
// it in missing_regions and the Tollgate-Missing-Regions header.
func TestGlobalUsageReport(t *testing.T) {
	servers := natstest.StartRegionsTB(t, []string{"eu", "us"})
	eu, euKafka := regionAggregator(t, "eu", servers[0].ClientURL())
	us, usKafka := regionAggregator(t, "us", servers[1].ClientURL())
	euAddr, usAddr := eu.srv.Addrs().API, us.srv.Addrs().API
	for _, addr := range []string{euAddr, usAddr} {
		testwait.Eventually(t, 30*time.Second, func() error {
			if code, _, b := op(t, addr, "PUT", "/admin/v1/rules", twoRegions); code != 200 {
				return fmt.Errorf("PUT rules: %d %s", code, b)
			}
			return nil
		})
	}

	// The same key decided in both regions, and a key in one only.
	now := time.Now()
	gEU, gUS := newGateway(t, euKafka, "gw-eu", 1), newGateway(t, usKafka, "gw-us", 1)
	for i := range 7 {
		gEU.emit(t, "acme", "key-both", i < 5, now)
	}
	for i := range 4 {
		gUS.emit(t, "acme", "key-both", i < 3, now)
	}
	gUS.emit(t, "acme", "key-us", true, now)
	waitTotals(t, euAddr, map[string]*counts{"acme": {5, 2}})
	waitTotals(t, usAddr, map[string]*counts{"acme": {4, 1}})

	all := url.Values{"regions": {"all"}}
	for _, addr := range []string{euAddr, usAddr} {
		testwait.Eventually(t, 30*time.Second, func() error {
			code, h, b, err := globalReport(addr, "acme", all)
			if err != nil {
				return err
			}
			var a globalAnswer
			if code != 200 || json.Unmarshal(b, &a) != nil {
				return fmt.Errorf("global report: %d %s", code, b)
			}
			if a.Totals.Allowed != 9 || a.Totals.Rejected != 3 || len(a.MissingRegions) != 0 ||
				!slices.Equal(a.Regions, []string{"eu", "us"}) || h.Get("Tollgate-Missing-Regions") != "" {
				return fmt.Errorf("global report from %s: %s, want 9 allowed 3 rejected from eu and us", addr, b)
			}
			rows := map[string][2]int64{}
			for _, r := range a.Rows {
				rows[r.KeyID] = [2]int64{r.Allowed, r.Rejected}
			}
			if rows["key-both"] != [2]int64{8, 3} || rows["key-us"] != [2]int64{1, 0} || len(a.Rows) != 2 {
				return fmt.Errorf("global report rows from %s: %s, want key-both 8/3 and key-us 1/0 in one row each", addr, b)
			}
			return nil
		})
	}

	// This region's own report is unchanged without regions.
	if code, _, b, _ := globalReport(euAddr, "acme", url.Values{}); code != 200 || json.Valid(b) && !jsonTotals(b, 5, 2) {
		t.Fatalf("eu's own report: %d %s, want 5 allowed 2 rejected", code, b)
	}
	for _, bad := range []url.Values{{"regions": {"us"}}, {"regions": {""}}, {"regions": {"all", "all"}}, {"regions": {"all"}, "cursor": {"x"}}} {
		code, _, b, err := globalReport(euAddr, "acme", bad)
		if err != nil || code != 400 || !json.Valid(b) || !jsonHas(b, "INVALID_REQUEST") {
			t.Errorf("report with %v: %d %s, want 400 INVALID_REQUEST", bad, code, b)
		}
	}

	wantEUOnly := func(how string) {
		t.Helper()
		start := time.Now()
		code, h, b, err := globalReport(euAddr, "acme", all)
		took := time.Since(start)
		var a globalAnswer
		if err != nil || code != 200 || json.Unmarshal(b, &a) != nil {
			t.Fatalf("global report with us %s: %v %d %s", how, err, code, b)
		}
		if !slices.Equal(a.MissingRegions, []string{"us"}) || h.Get("Tollgate-Missing-Regions") != "us" ||
			!slices.Equal(a.Regions, []string{"eu"}) || a.Totals.Allowed != 5 || a.Totals.Rejected != 2 {
			t.Fatalf("global report with us %s: %s (header %q), want eu's 5/2 and us missing", how, b, h.Get("Tollgate-Missing-Regions"))
		}
		if took > aggregator.RegionReportTimeout+5*time.Second {
			t.Errorf("global report with us %s took %v", how, took)
		}
		t.Logf("global report with us %s answered in %v", how, took)
	}
	if err := servers[1].CutLinks(); err != nil {
		t.Fatal(err)
	}
	wantEUOnly("cut off")
	if err := servers[1].HealLinks(); err != nil {
		t.Fatal(err)
	}
	natstest.WaitLinkedTB(t, servers)
	us.stop(t)
	wantEUOnly("down")
}

func jsonTotals(b []byte, allowed, rejected int64) bool {
	var a answer
	return json.Unmarshal(b, &a) == nil && a.Totals.Allowed == allowed && a.Totals.Rejected == rejected
}

func jsonHas(b []byte, code string) bool {
	var e struct {
		Error struct{ Code string } `json:"error"`
	}
	return json.Unmarshal(b, &e) == nil && e.Error.Code == code
}
