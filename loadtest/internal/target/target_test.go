package target_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/httpguard"
	"github.com/tollgate/tollgate/loadtest/internal/gen"
	"github.com/tollgate/tollgate/loadtest/internal/keyspace"
	"github.com/tollgate/tollgate/loadtest/internal/report"
	"github.com/tollgate/tollgate/loadtest/internal/target"
	"github.com/tollgate/tollgate/loadtest/internal/testtarget"
)

func TestClassifyHTTP(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		code int
		want string
	}{
		{200, "2xx"}, {204, "2xx"}, {400, "400"}, {403, "403"}, {429, "429"}, {404, "4xx"},
		{401, "4xx"}, {500, "5xx"}, {503, "5xx"}, {302, "other"}, {101, "other"},
	} {
		if got := target.HTTPOutcomes[target.ClassifyHTTP(tt.code)].Name; got != tt.want {
			t.Errorf("ClassifyHTTP(%d) = %s, want %s", tt.code, got, tt.want)
		}
	}
}

// TestClassifyAnswer: the penalty ladder's answers, as the gateway's own
// code writes them (JSON and problem+json), are told apart from a rule's
// 429 and an operator's 403; through the proxy target too, whatever the
// body's length.
func TestClassifyAnswer(t *testing.T) {
	t.Parallel()
	const why = "20 of 20 requests in 60s arrived while a Retry-After was running (100%)"
	until := time.Now().Add(time.Hour).UnixMicro()
	limited := guard.Decision{Status: 429, Code: guard.CodeRateLimitExceeded, Reason: guard.ReasonRateLimited, RetryAfter: 7,
		Deciding: 0, Rules: []guard.RuleResult{{ID: "per-key", Limit: 5, Window: 60, RetryAfter: 7}}}
	cooldown := guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: 900,
		PenaltyLevel: 2, PenaltyUntil: until, PenaltyReason: why}
	top := guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1,
		PenaltyLevel: 3, PenaltyUntil: until, PenaltyReason: strings.Repeat(why, 3), CloseConnection: true}
	operator := guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1}
	tests := []struct {
		name string
		d    guard.Decision
		want string
	}{
		{"a rule's 429", limited, "429"},
		{"429 PENALTY", cooldown, "429 PENALTY"},
		{"the ladder's 403", top, "403 PENALTY"},
		{"an operator's 403", operator, "403"},
	}
	for _, tt := range tests {
		for _, accept := range []string{"application/json", "application/problem+json"} {
			rec := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			r.Header.Set("Accept", accept)
			httpguard.WriteDecision(rec, r, &tt.d)
			if got := target.HTTPOutcomes[target.ClassifyAnswer(rec.Code, rec.Body.Bytes())].Name; got != tt.want &&
				!(accept != "application/json" && tt.d.Status == 403) { // problem+json has no details
				t.Errorf("%s, %s: %s, want %s (body %s)", tt.name, accept, got, tt.want, rec.Body)
			}
		}
	}
	// Through the proxy target: the body read to classify it, then drained.
	srv := testtarget.StartHTTP(t, func(w http.ResponseWriter, r *http.Request, key string, _ int64) {
		for _, tt := range tests {
			if tt.name == key {
				httpguard.WriteDecision(w, r, &tt.d)
				_, _ = w.Write([]byte(strings.Repeat(" ", 64<<10))) // more than PeekBytes: drained
				return
			}
		}
	})
	p := target.NewProxy(target.HTTPConfig{URL: srv.URL, Method: http.MethodGet, Conns: 1})
	defer p.Close()
	for range 2 {
		for _, tt := range tests {
			o, err := p.Do(t.Context(), gen.Request{Key: tt.name, Path: "/v1/x"})
			if err != nil {
				t.Fatal(err)
			}
			if got := p.Outcomes()[o]; got.Name != tt.want || got.Penalty != strings.Contains(tt.want, "PENALTY") {
				t.Errorf("proxy, %s: %+v, want %s", tt.name, got, tt.want)
			}
		}
	}
	if c := srv.Conns(); c > 2 {
		t.Errorf("%d connections for sequential requests: bodies not drained", c)
	}
}

// TestClassifyRLS: OVER_LIMIT answers of the penalty ladder, as the
// gateway's RLS service words them.
func TestClassifyRLS(t *testing.T) {
	t.Parallel()
	hdr := func(kv ...string) []*corev3.HeaderValue {
		var out []*corev3.HeaderValue
		for i := 0; i < len(kv); i += 2 {
			out = append(out, &corev3.HeaderValue{Key: kv[i], Value: kv[i+1]})
		}
		return out
	}
	over := rlsv3.RateLimitResponse_OVER_LIMIT
	for _, tt := range []struct {
		name string
		resp *rlsv3.RateLimitResponse
		want string
	}{
		{"ok", &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, "OK"},
		{"a rule's rejection", &rlsv3.RateLimitResponse{OverallCode: over,
			ResponseHeadersToAdd: hdr("x-ratelimit-limit", "5", "retry-after", "7")}, "OVER_LIMIT"},
		{"429 PENALTY", &rlsv3.RateLimitResponse{OverallCode: over, ResponseHeadersToAdd: hdr("retry-after", "900")}, "OVER_LIMIT PENALTY"},
		{"the ladder's 403", &rlsv3.RateLimitResponse{OverallCode: over, ResponseHeadersToAdd: hdr("content-type", "application/json"),
			RawBody: []byte(`{"error":{"code":"KEY_BLOCKED","message":"…","details":{"penalty_level":3}}}`)}, "OVER_LIMIT PENALTY"},
		{"an operator's 403", &rlsv3.RateLimitResponse{OverallCode: over, ResponseHeadersToAdd: hdr("content-type", "application/json"),
			RawBody: []byte(`{"error":{"code":"KEY_BLOCKED","message":"This API key is blocked."}}`)}, "OVER_LIMIT"},
		{"unknown", &rlsv3.RateLimitResponse{}, "UNKNOWN"},
	} {
		if got := target.RLSOutcomes[target.ClassifyRLS(tt.resp)].Name; got != tt.want {
			t.Errorf("%s: %s, want %s", tt.name, got, tt.want)
		}
	}
}

func TestProxy(t *testing.T) {
	t.Parallel()
	type seen struct{ method, path, key, body string }
	got := make(chan seen, 1)
	srv := testtarget.StartHTTP(t, func(w http.ResponseWriter, r *http.Request, key string, _ int64) {
		b, _ := io.ReadAll(r.Body)
		got <- seen{r.Method, r.URL.Path, key, string(b)}
		w.WriteHeader(http.StatusTooManyRequests)
		_, _ = w.Write([]byte(strings.Repeat("x", 64<<10))) // drained by the client
	})
	p := target.NewProxy(target.HTTPConfig{URL: srv.URL + "/api/", Method: http.MethodPost, Body: []byte(`{"q":1}`), Conns: 1})
	defer p.Close()
	for range 3 {
		o, err := p.Do(t.Context(), gen.Request{Key: "sk_1", Path: "/v1/search"})
		if err != nil {
			t.Fatal(err)
		}
		if p.Outcomes()[o].Name != "429" {
			t.Errorf("outcome %s, want 429", p.Outcomes()[o].Name)
		}
		if s := <-got; s != (seen{"POST", "/api/v1/search", "sk_1", `{"q":1}`}) {
			t.Errorf("server saw %+v", s)
		}
	}
	if c := srv.Conns(); c > 2 {
		t.Errorf("%d connections for 3 sequential requests: bodies not drained or no keep-alive", c)
	}
	// An empty path sends to the URL as given.
	if _, err := p.Do(t.Context(), gen.Request{Key: "sk_1"}); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s.path != "/api" {
		t.Errorf("empty path sent to %q, want /api", s.path)
	}
}

func TestCheck(t *testing.T) {
	t.Parallel()
	srv := testtarget.StartHTTP(t, func(w http.ResponseWriter, _ *http.Request, key string, _ int64) {
		w.WriteHeader(map[string]int{"ok": 200, "blocked": 403, "bad": 400}[key])
	})
	c := target.NewCheck(target.HTTPConfig{URL: srv.URL + "/v1/check", Method: "GET", Cost: 1, Conns: 1})
	defer c.Close()
	for key, want := range map[string]string{"ok": "2xx", "blocked": "403", "bad": "400"} {
		o, err := c.Do(t.Context(), gen.Request{Key: key, Path: "/v1/items"})
		if err != nil {
			t.Fatal(err)
		}
		if c.Outcomes()[o].Name != want {
			t.Errorf("key %s: outcome %s, want %s", key, c.Outcomes()[o].Name, want)
		}
	}
	if n := srv.ByKey(); n["ok"] != 1 || n["blocked"] != 1 || n["bad"] != 1 {
		t.Errorf("server saw keys %v", n)
	}
}

// TestCheckBody decodes the body strictly: exactly the four fields the check API
// reads, with the bearer token and the content type.
func TestCheckBody(t *testing.T) {
	t.Parallel()
	type seen struct {
		method, path, auth, ctype string
		body                      target.CheckBody
		err                       error
	}
	got := make(chan seen, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s := seen{method: r.Method, path: r.URL.Path, auth: r.Header.Get("Authorization"), ctype: r.Header.Get("Content-Type")}
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		s.err = dec.Decode(&s.body)
		got <- s
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer srv.Close()
	c := target.NewCheck(target.HTTPConfig{URL: srv.URL + "/v1/check", Method: "DELETE", Token: "s3cret", Cost: 3, Conns: 1})
	defer c.Close()
	o, err := c.Do(t.Context(), gen.Request{Key: "sk_9", Path: "/v1/items"})
	if err != nil {
		t.Fatal(err)
	}
	if c.Outcomes()[o].Name != "429" {
		t.Errorf("outcome %s, want 429", c.Outcomes()[o].Name)
	}
	s := <-got
	want := seen{method: "POST", path: "/v1/check", auth: "Bearer s3cret", ctype: "application/json",
		body: target.CheckBody{APIKey: "sk_9", Endpoint: "/v1/items", Method: "DELETE", Cost: 3}}
	if s != want {
		t.Errorf("server saw %+v\nwant %+v", s, want)
	}

	// No token, no Authorization header.
	c2 := target.NewCheck(target.HTTPConfig{URL: srv.URL + "/v1/check", Method: "GET", Cost: 1, Conns: 1})
	defer c2.Close()
	if _, err := c2.Do(t.Context(), gen.Request{Key: "sk_9", Path: "/"}); err != nil {
		t.Fatal(err)
	}
	if s := <-got; s.auth != "" {
		t.Errorf("Authorization %q sent without a token", s.auth)
	}
}

func TestRLS(t *testing.T) {
	t.Parallel()
	type seen struct {
		domain, key, path string
		hits              uint32
		descHits          *uint64
		entries           int
	}
	var last = make(chan seen, 1000)
	srv := testtarget.StartRLS(t, func(_ context.Context, req *rlsv3.RateLimitRequest, n int64) (*rlsv3.RateLimitResponse, error) {
		d := req.GetDescriptors()[0]
		s := seen{domain: req.GetDomain(), hits: req.GetHitsAddend(), entries: len(d.GetEntries())}
		for _, e := range d.GetEntries() {
			switch e.GetKey() {
			case target.EntryAPIKey:
				s.key = e.GetValue()
			case target.EntryPath:
				s.path = e.GetValue()
			}
		}
		if h := d.GetHitsAddend(); h != nil {
			v := h.GetValue()
			s.descHits = &v
		}
		last <- s
		switch {
		case s.key == "sk_load_0":
			return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, nil
		case s.key == "sk_load_1" && n%2 == 0:
			return nil, status.Error(codes.Unavailable, "not now")
		}
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK}, nil
	})

	t.Run("request fields and cost", func(t *testing.T) {
		for _, tt := range []struct {
			cost     int
			hits     uint32
			descHits *uint64
		}{{1, 0, nil}, {5, 5, nil}, {0, 0, new(uint64(0))}} {
			r, err := target.NewRLS(target.RLSConfig{Addrs: []string{srv.Addr}, Domain: "edge", Cost: tt.cost, Conns: 2})
			if err != nil {
				t.Fatal(err)
			}
			o, err := r.Do(t.Context(), gen.Request{Key: "sk_load_7", Path: "/v1/x"})
			_ = r.Close()
			if err != nil {
				t.Fatal(err)
			}
			if r.Outcomes()[o].Name != "OK" {
				t.Errorf("outcome %s, want OK", r.Outcomes()[o].Name)
			}
			s := <-last
			if s.domain != "edge" || s.key != "sk_load_7" || s.path != "/v1/x" || s.entries != 2 || s.hits != tt.hits {
				t.Errorf("cost %d: server saw %+v", tt.cost, s)
			}
			if (s.descHits == nil) != (tt.descHits == nil) || (s.descHits != nil && *s.descHits != *tt.descHits) {
				t.Errorf("cost %d: descriptor hits_addend %v, want %v", tt.cost, s.descHits, tt.descHits)
			}
		}
	})

	t.Run("load", func(t *testing.T) {
		r, err := target.NewRLS(target.RLSConfig{Addrs: []string{srv.Addr}, Domain: "edge", Cost: 1, Conns: 2})
		if err != nil {
			t.Fatal(err)
		}
		defer r.Close()
		before := srv.ByKey()
		rec := report.NewRecorder(r.Outcomes())
		res, err := gen.Run(t.Context(), gen.Config{
			Target: r, Recorder: rec, Seed: 1, Workers: 4, Requests: 300, Duration: time.Minute, Timeout: 5 * time.Second,
			Keys: keyspace.Config{Keys: 10, Prefix: "sk_load_", Dist: keyspace.Zipf, ZipfS: 1.5, Paths: []string{"/"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		after := srv.ByKey()
		snap := rec.Snapshot()
		overLimit := after["sk_load_0"] - before["sk_load_0"]
		if res.Sent != 300 || snap.Answered()+snap.Errors != 300 {
			t.Errorf("sent %d, answered %d, errors %d", res.Sent, snap.Answered(), snap.Errors)
		}
		if snap.Counts[target.RLSOverLimit] != overLimit || overLimit == 0 {
			t.Errorf("OVER_LIMIT %d, server refused %d", snap.Counts[target.RLSOverLimit], overLimit)
		}
		if snap.Errors == 0 {
			t.Error("no gRPC error counted")
		}
		for msg := range rec.ErrorSamples() {
			if !strings.Contains(msg, "Unavailable") {
				t.Errorf("error sample %q", msg)
			}
		}
	})
}
