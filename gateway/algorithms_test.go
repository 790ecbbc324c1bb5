package gateway_test

import (
	"encoding/json"
	"net/http"
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// algoTiers puts a key of prefix <alg>_ in tier <alg>, whose rule uses
// that algorithm; the rules follow.
const algoTiers = `
tiers:
  - {pattern: "tb_*", tier: tb}
  - {pattern: "gcra_*", tier: gcra}
  - {pattern: "fw_*", tier: fw}
  - {pattern: "swl_*", tier: swl}
  - {pattern: "swc_*", tier: swc}
rules:
`

// algoRules has one rule per algorithm, each 3 units per hour, so that the
// values of a short test are exact.
const algoRules = `
version: 3` + algoTiers + `  - {id: tb, match: {tier: tb}, algorithm: token_bucket, capacity: 3, rate: 3/1h}
  - {id: gcra, match: {tier: gcra}, algorithm: gcra, limit: 3, window: 1h, burst: 3}
  - {id: fw, match: {tier: fw}, algorithm: fixed_window, limit: 3, window: 1h}
  - {id: swl, match: {tier: swl}, algorithm: sliding_window_log, limit: 3, window: 1h}
  - {id: swc, match: {tier: swc}, algorithm: sliding_window_counter, limit: 3, window: 1h}
`

// expected are the header values after k units of 3 are consumed, at time
// now (Unix seconds), in the hour ending at end: t (RateLimit `t`), the
// Retry-After of the next request once k == 3, X-RateLimit-Reset, and
// whether t and retry are exact (else ±1 s: they depend on the wall clock).
func expected(alg string, k int64, now float64, end int64) (t, retry, reset int64, exact bool) {
	ceil := func(x float64) int64 { return int64(x + 0.999999) }
	switch alg {
	case "tb", "gcra": // one unit every 1200 s
		return 1200, 1200, ceil(now + float64(1200*k)), true
	case "swl": // the oldest entry leaves after 3600 s
		return 3600, 3600, ceil(now + 3600), true
	case "fw": // everything comes back at the end of the hour
		left := ceil(float64(end) - now)
		return left, left, end, false
	case "swc": // the count of this hour decays during the next one
		left := float64(end) - now
		return ceil(left + 3600/float64(k)), ceil(left + 1200), end + 3600, false
	}
	panic(alg)
}

func TestAlgorithmsHeaders(t *testing.T) {
	t.Parallel()
	var upstreamHits atomic.Int64
	e := newEnv(t, envOptions{rules: algoRules, upstream: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		upstreamHits.Add(1)
		w.Header().Set("X-RateLimit-Limit", "999") // replaced by the gateway's
		echo(w, r)
	})})
	startHour := time.Now().Unix() / 3600

	for _, alg := range []string{"tb", "gcra", "fw", "swl", "swc"} {
		for _, surface := range []string{"proxy", "api"} {
			t.Run(alg+"/"+surface, func(t *testing.T) {
				key := uniqueKey(alg + "_")
				hitsBefore := upstreamHits.Load()
				var first [2]float64 // the first request's time bounds (sliding log: the oldest entry)
				for k := int64(1); k <= 4; k++ {
					now := float64(time.Now().UnixMicro()) / 1e6
					end := (int64(now)/3600 + 1) * 3600
					var resp *http.Response
					var body []byte
					if surface == "proxy" {
						resp, body = e.proxyGet("/alg", key)
					} else {
						resp, body = e.post(e.gw, "/v1/check", map[string]any{"api_key": key, "endpoint": "/alg", "method": "GET"}, nil)
					}
					h := resp.Header
					// The decision was made between now and after (Redis
					// time, on a machine that may be slow): an exact figure
					// must match one of the instants in between.
					after := float64(time.Now().UnixMicro()) / 1e6
					if k == 1 {
						first = [2]float64{now, after}
					}
					consumed := min(k, 3)
					at := [2]float64{now, after}
					if alg == "swl" {
						at = first
					}
					wantT, wantRetry, wantReset, exact := expected(alg, consumed, at[0], end)
					hiT, hiRetry, hiReset, _ := expected(alg, consumed, at[1], end)
					if alg == "tb" || alg == "gcra" {
						// A bucket is full again 1200 s per unit after the
						// first request: what refilled since then is
						// already counted, so the reset is anchored there,
						// not at this request (seconds apart on a slow
						// machine, and a second boundary may fall between).
						_, _, wantReset, _ = expected(alg, consumed, first[0], end)
					}
					near := func(name string, got, want int64) {
						t.Helper()
						hi := map[string]int64{"X-RateLimit-Reset": hiReset, "RateLimit t": hiT, "Retry-After": hiRetry}[name]
						lo, up := min(want, hi), max(want, hi)
						if exact && (got < lo || got > up) || !exact && (got < lo-1 || got > up+1) {
							t.Errorf("request %d: %s = %d, want %d..%d (exact %v)", k, name, got, lo, up, exact)
						}
					}

					wantStatus := http.StatusOK
					if k == 4 {
						wantStatus = http.StatusTooManyRequests
					}
					if resp.StatusCode != wantStatus {
						t.Fatalf("request %d: status %d, want %d; body %s", k, resp.StatusCode, wantStatus, body)
					}
					if got := headerInt(t, h, "X-RateLimit-Limit"); got != 3 {
						t.Errorf("request %d: X-RateLimit-Limit %d, want 3", k, got)
					}
					if got := headerInt(t, h, "X-RateLimit-Remaining"); got != 3-consumed {
						t.Errorf("request %d: X-RateLimit-Remaining %d, want %d", k, got, 3-consumed)
					}
					if got := headerInt(t, h, "X-RateLimit-Used"); got != consumed {
						t.Errorf("request %d: X-RateLimit-Used %d, want %d", k, got, consumed)
					}
					if got := h.Get("X-RateLimit-Resource"); got != alg {
						t.Errorf("request %d: X-RateLimit-Resource %q", k, got)
					}
					if got := h.Values("X-RateLimit-Limit"); len(got) != 1 {
						t.Errorf("request %d: X-RateLimit-Limit values %q (the upstream's must be replaced)", k, got)
					}
					near("X-RateLimit-Reset", headerInt(t, h, "X-RateLimit-Reset"), wantReset)

					policy := sfList(t, h, "RateLimit-Policy")
					if len(policy) != 1 || policy[alg]["q"] != 3 || policy[alg]["w"] != 3600 {
						t.Errorf("request %d: RateLimit-Policy %q, want %q;q=3;w=3600", k, h.Get("RateLimit-Policy"), alg)
					}
					rl := sfList(t, h, "RateLimit")
					if len(rl) != 1 || rl[alg]["r"] != 3-consumed {
						t.Errorf("request %d: RateLimit %q, want r=%d", k, h.Get("RateLimit"), 3-consumed)
					}
					near("RateLimit t", rl[alg]["t"], wantT)

					if k < 4 {
						if h.Get("Retry-After") != "" {
							t.Errorf("request %d: Retry-After %q on an admission", k, h.Get("Retry-After"))
						}
					} else {
						ra := headerInt(t, h, "Retry-After")
						near("Retry-After", ra, wantRetry)
						if ra < rl[alg]["t"] {
							t.Errorf("Retry-After %d is shorter than t %d", ra, rl[alg]["t"])
						}
					}

					switch surface {
					case "api":
						var d decisionBody
						if err := json.Unmarshal(body, &d); err != nil {
							t.Fatal(err)
						}
						wantRA := int64(0)
						if k == 4 {
							wantRA, _ = strconv.ParseInt(h.Get("Retry-After"), 10, 64)
						}
						if d.Allowed != (k < 4) || d.Status != wantStatus || d.Limit != 3 || d.Remaining != 3-consumed ||
							d.Reset != headerInt(t, h, "X-RateLimit-Reset") || d.RetryAfter != wantRA || d.Rule != alg || d.Degraded {
							t.Errorf("request %d: decision %s", k, body)
						}
						if k == 4 && (d.Error == nil || d.Error.Code != "RATE_LIMIT_EXCEEDED" || d.Reason != "rate_limited") {
							t.Errorf("request 4: decision %s", body)
						}
						if k < 4 && d.Error != nil {
							t.Errorf("request %d: error object on an admission: %s", k, body)
						}
					case "proxy":
						if k < 4 && string(body) != "upstream /alg" {
							t.Errorf("request %d: body %q", k, body)
						}
						if k == 4 {
							var eb rejectionBody
							if err := json.Unmarshal(body, &eb); err != nil || eb.Error.Code != "RATE_LIMIT_EXCEEDED" ||
								eb.Error.Details.Rule != alg || strconv.FormatInt(eb.Error.Details.RetryAfterSeconds, 10) != h.Get("Retry-After") {
								t.Errorf("429 body %s (%v)", body, err)
							}
						}
					}
				}
				if surface == "proxy" && upstreamHits.Load()-hitsBefore != 3 {
					t.Errorf("upstream saw %d requests, want 3 (the 429 is answered by the gateway)", upstreamHits.Load()-hitsBefore)
				}
			})
		}
	}
	if time.Now().Unix()/3600 != startHour {
		t.Log("the test crossed an hour boundary: fixed and sliding window expectations may have been off by a window")
	}
}

// TestRetryAfterIsNeverEarly: a client that waits exactly Retry-After and
// retries once is admitted, for every algorithm (1 s windows, real time).
func TestRetryAfterIsNeverEarly(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{rules: algoTiers + `  - {id: tb, match: {tier: tb}, algorithm: token_bucket, capacity: 2, rate: 2/1s}
  - {id: gcra, match: {tier: gcra}, algorithm: gcra, limit: 2, window: 1s, burst: 2}
  - {id: fw, match: {tier: fw}, algorithm: fixed_window, limit: 2, window: 1s}
  - {id: swl, match: {tier: swl}, algorithm: sliding_window_log, limit: 2, window: 1s}
  - {id: swc, match: {tier: swc}, algorithm: sliding_window_counter, limit: 2, window: 1s}
`})
	for _, alg := range []string{"tb", "gcra", "fw", "swl", "swc"} {
		t.Run(alg, func(t *testing.T) {
			t.Parallel()
			key := uniqueKey(alg + "_")
			body := map[string]any{"api_key": key, "endpoint": "/r"}
			var retry int64
			for i := 0; ; i++ {
				resp, d := e.check(body)
				if resp.StatusCode == http.StatusTooManyRequests {
					retry = headerInt(t, resp.Header, "Retry-After")
					if retry < 1 || retry != d.RetryAfter {
						t.Fatalf("Retry-After %d, body retry_after %d", retry, d.RetryAfter)
					}
					break
				}
				if i > 10 {
					t.Fatal("never rejected")
				}
			}
			<-time.After(time.Duration(retry) * time.Second) // what a well-behaved client does
			if resp, d := e.check(body); resp.StatusCode != http.StatusOK {
				t.Fatalf("after waiting Retry-After %ds: status %d, %+v", retry, resp.StatusCode, d)
			}
		})
	}
}
