package httpguard

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
)

// errorBody is the JSON error body.
type errorBody struct {
	Error struct {
		Code    string          `json:"code"`
		Message string          `json:"message"`
		Details json.RawMessage `json:"details"`
	} `json:"error"`
}

type rateDetails struct {
	Rule              *string `json:"rule"`
	Limit             *int64  `json:"limit"`
	Remaining         *int64  `json:"remaining"`
	WindowSeconds     *int64  `json:"window_seconds"`
	RetryAfterSeconds *int64  `json:"retry_after_seconds"`
	ResetAt           *string `json:"reset_at"`
	// The penalty ladder's.
	PenaltyLevel  *int    `json:"penalty_level"`
	PenaltyReason *string `json:"penalty_reason"`
	ExpiresAt     *string `json:"expires_at"`
}

// problemBody is an RFC 9457 problem as WriteDecision writes it.
type problemBody struct {
	Type             string   `json:"type"`
	Title            string   `json:"title"`
	Status           int      `json:"status"`
	Detail           string   `json:"detail"`
	Code             string   `json:"code"`
	ViolatedPolicies []string `json:"violated-policies"`
}

// decodeStrict decodes exactly one JSON value and refuses unknown fields.
func decodeStrict(t *testing.T, body string, v any) {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Fatalf("decode %s: %v", body, err)
	}
	if dec.More() {
		t.Fatalf("trailing data after JSON body %s", body)
	}
}

// written is what WriteDecision answers d to a GET of path that accepts
// accept.
func written(d *guard.Decision, path, accept string) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodGet, path, nil)
	r.Header.Set("Accept", accept)
	WriteDecision(rec, r, d)
	return rec
}

func TestWriteDecisionJSON(t *testing.T) {
	t.Parallel()
	penalty := guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: 900,
		KeyID: "kid-should-not-show", KeyPrefix: "sk_secret_pre"}
	costly := rejectedDecision()
	costly.Status, costly.Code, costly.Reason, costly.RetryAfter, costly.Cost = 400, guard.CodeCostExceedsLimit, guard.ReasonCostExceedsLimit, 0, 50
	const why = "20 of 20 requests in 60s arrived while a Retry-After was running (100%)"
	until := time.Date(2026, 11, 27, 19, 21, 2, 330_266_000, time.UTC).UnixMicro()
	ladder2 := penalty
	ladder2.PenaltyLevel, ladder2.PenaltyReason, ladder2.PenaltyUntil = 2, why, until
	ladder3 := guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1,
		PenaltyLevel: 3, PenaltyReason: why, PenaltyUntil: until, CloseConnection: true}
	ladder3Lifted := ladder3
	ladder3Lifted.PenaltyUntil, ladder3Lifted.PenaltyReason = math.MaxInt64, ""
	weird := rejectedDecision()
	weird.Rules[1].ID = "a\"b\\c\n</script>\u2028"
	weird.Rules[1].Reset = 1_700_000_000

	tests := []struct {
		name       string
		d          guard.Decision
		status     int
		code       string
		details    *rateDetails // nil: no details member
		retryAfter string
	}{
		{
			name: "rate limited", d: rejectedDecision(), status: 429, code: guard.CodeRateLimitExceeded, retryAfter: "7",
			details: &rateDetails{Rule: ptr("search"), Limit: ptr[int64](30), Remaining: ptr[int64](0), WindowSeconds: ptr[int64](60),
				RetryAfterSeconds: ptr[int64](7), ResetAt: ptr("2023-11-14T22:14:20Z")},
		},
		{
			name: "penalty", d: penalty, status: 429, code: guard.CodePenalty, retryAfter: "900",
			details: &rateDetails{RetryAfterSeconds: ptr[int64](900)},
		},
		{
			name: "weird rule id", d: weird, status: 429, code: guard.CodeRateLimitExceeded, retryAfter: "7",
			details: &rateDetails{Rule: ptr("a\"b\\c\n</script>\u2028"), Limit: ptr[int64](30), Remaining: ptr[int64](0),
				WindowSeconds: ptr[int64](60), RetryAfterSeconds: ptr[int64](7), ResetAt: ptr("2023-11-14T22:13:20Z")},
		},
		{
			name: "penalty ladder, level 2", d: ladder2, status: 429, code: guard.CodePenalty, retryAfter: "900",
			details: &rateDetails{RetryAfterSeconds: ptr[int64](900), PenaltyLevel: ptr(2), PenaltyReason: ptr(why),
				ExpiresAt: ptr("2026-11-27T19:21:03Z")},
		},
		{
			name: "blocked", d: guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1},
			status: 403, code: guard.CodeKeyBlocked,
		},
		{
			name: "blocked by the penalty ladder", d: ladder3, status: 403, code: guard.CodeKeyBlocked,
			details: &rateDetails{PenaltyLevel: ptr(3), PenaltyReason: ptr(why), ExpiresAt: ptr("2026-11-27T19:21:03Z")},
		},
		{
			name: "blocked by the penalty ladder until lifted", d: ladder3Lifted, status: 403, code: guard.CodeKeyBlocked,
			details: &rateDetails{PenaltyLevel: ptr(3)},
		},
		{
			name: "cost exceeds limit", d: costly, status: 400, code: guard.CodeCostExceedsLimit,
		},
		{
			name: "code from status", d: guard.Decision{Status: 403, Deciding: -1}, status: 403, code: guard.CodeKeyBlocked,
		},
		{
			name: "code from reason", d: guard.Decision{Status: 429, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: 3},
			status: 429, code: guard.CodePenalty, retryAfter: "3", details: &rateDetails{RetryAfterSeconds: ptr[int64](3)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := written(&tt.d, "/v1/search", "application/json")

			if rec.Code != tt.status {
				t.Errorf("status = %d, want %d", rec.Code, tt.status)
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if got := rec.Header().Get("Retry-After"); got != tt.retryAfter {
				t.Errorf("Retry-After = %q, want %q", got, tt.retryAfter)
			}
			var body errorBody
			decodeStrict(t, rec.Body.String(), &body)
			if body.Error.Code != tt.code {
				t.Errorf("code = %q, want %q", body.Error.Code, tt.code)
			}
			if body.Error.Message == "" {
				t.Error("empty message")
			}
			for _, secret := range []string{tt.d.KeyID, tt.d.KeyPrefix} {
				if secret != "" && strings.Contains(rec.Body.String(), secret) {
					t.Errorf("body %s contains %q", rec.Body.String(), secret)
				}
			}
			if tt.details == nil {
				if body.Error.Details != nil {
					t.Errorf("details = %s, want none", body.Error.Details)
				}
				return
			}
			var got rateDetails
			decodeStrict(t, string(body.Error.Details), &got)
			if g, w := jsonString(t, got), jsonString(t, *tt.details); g != w {
				t.Errorf("details = %s, want %s", g, w)
			}
			if got.ResetAt != nil {
				if _, err := time.Parse(time.RFC3339, *got.ResetAt); err != nil {
					t.Errorf("reset_at: %v", err)
				}
			}
		})
	}
}

func jsonString(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestWriteDecisionProblem(t *testing.T) {
	t.Parallel()
	penalty := guard.Decision{Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: 60}
	tests := []struct {
		name   string
		d      guard.Decision
		want   problemBody
		noList bool
	}{
		{
			name: "quota exceeded", d: rejectedDecision(),
			want: problemBody{Type: ProblemQuotaExceeded, Title: problemTitleQuotaExceeded, Status: 429,
				Code: guard.CodeRateLimitExceeded, ViolatedPolicies: []string{"search", "burst"}},
		},
		{
			name: "penalty", d: penalty,
			want: problemBody{Type: ProblemAbnormalUsage, Title: problemTitleAbnormalUsage, Status: 429,
				Code: guard.CodePenalty, ViolatedPolicies: []string{}},
		},
		{
			name: "blocked", d: guard.Decision{Status: 403, Code: guard.CodeKeyBlocked, Deciding: -1}, noList: true,
			want: problemBody{Type: "about:blank", Title: "Forbidden", Status: 403, Code: guard.CodeKeyBlocked},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := written(&tt.d, "/", "application/problem+json, application/json;q=0.9")
			if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("Content-Type = %q", ct)
			}
			if rec.Code != tt.want.Status {
				t.Errorf("status = %d, want %d", rec.Code, tt.want.Status)
			}
			var raw map[string]any
			decodeStrict(t, rec.Body.String(), &raw)
			if _, ok := raw["violated-policies"]; ok == tt.noList {
				t.Errorf("violated-policies present = %v, want %v", ok, !tt.noList)
			}
			var got problemBody
			decodeStrict(t, rec.Body.String(), &got)
			if got.Detail == "" {
				t.Error("empty detail")
			}
			got.Detail = ""
			if g, w := jsonString(t, got), jsonString(t, tt.want); g != w {
				t.Errorf("problem = %s, want %s", g, w)
			}
		})
	}
}

// An admission writes headers only: the caller writes the response.
func TestWriteDecisionAllowed(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	d := allowedDecision()
	WriteDecision(rec, nil, &d)
	if rec.Body.Len() != 0 || rec.Flushed {
		t.Errorf("body %q written for an admission", rec.Body.String())
	}
	if got := rec.Header().Get("X-RateLimit-Remaining"); got != "12" {
		t.Errorf("X-RateLimit-Remaining = %q, want 12", got)
	}
	if got := rec.Header().Get("Content-Type"); got != "" {
		t.Errorf("Content-Type = %q, want none", got)
	}
}

func TestWriteError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, accept string
		problem      bool
	}{
		{name: "json", accept: ""},
		{name: "problem", accept: "application/problem+json", problem: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodGet, "/", nil)
			if tt.accept != "" {
				r.Header.Set("Accept", tt.accept)
			}
			WriteError(rec, r, http.StatusBadRequest, guard.CodeInvalidKey, "The API key is malformed.")
			if rec.Code != 400 {
				t.Errorf("status = %d", rec.Code)
			}
			if got := rec.Header().Get("X-Content-Type-Options"); got != "nosniff" {
				t.Errorf("X-Content-Type-Options = %q", got)
			}
			if tt.problem {
				var p problemBody
				decodeStrict(t, rec.Body.String(), &p)
				want := problemBody{Type: "about:blank", Title: "Bad Request", Status: 400,
					Detail: "The API key is malformed.", Code: guard.CodeInvalidKey}
				if g, w := jsonString(t, p), jsonString(t, want); g != w {
					t.Errorf("problem = %s, want %s", g, w)
				}
				return
			}
			var b errorBody
			decodeStrict(t, rec.Body.String(), &b)
			if b.Error.Code != guard.CodeInvalidKey || b.Error.Message != "The API key is malformed." || b.Error.Details != nil {
				t.Errorf("body = %s", rec.Body.String())
			}
		})
	}
}

func TestWantsProblem(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		accept []string
		want   bool
	}{
		{"absent", nil, false},
		{"empty", []string{""}, false},
		{"json", []string{"application/json"}, false},
		{"problem", []string{"application/problem+json"}, true},
		{"problem case-insensitive", []string{"Application/Problem+JSON"}, true},
		{"problem with params", []string{"application/problem+json; charset=utf-8"}, true},
		{"any", []string{"*/*"}, false},
		{"application wildcard", []string{"application/*"}, false},
		{"browser", []string{"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}, false},
		{"tie goes to problem", []string{"application/json, application/problem+json"}, true},
		{"json preferred", []string{"application/json, application/problem+json;q=0.9"}, false},
		{"problem preferred", []string{"application/json;q=0.5, application/problem+json"}, true},
		{"problem refused", []string{"application/problem+json;q=0"}, false},
		{"problem refused json wildcard", []string{"application/problem+json;q=0, */*"}, false},
		{"wildcard outweighs", []string{"application/*, application/problem+json;q=0.5"}, false},
		{"json refused", []string{"application/json;q=0, application/problem+json;q=0.1"}, true},
		{"specific json beats wildcard q", []string{"*/*;q=1, application/json;q=0.2, application/problem+json;q=0.3"}, true},
		{"low wildcard", []string{"application/problem+json;q=0.5, */*;q=0.1"}, true},
		{"several lines", []string{"text/html", "application/problem+json"}, true},
		{"bad q ignored", []string{"application/problem+json;q=2"}, false},
		{"bad q text ignored", []string{"application/problem+json;q=high"}, false},
		{"q with three decimals", []string{"application/json;q=0.001, application/problem+json;q=0.002"}, true},
		{"q too precise", []string{"application/problem+json;q=0.0001"}, false},
		{"q one", []string{"application/problem+json;q=1.000"}, true},
		{"q spaces", []string{"application/problem+json ; q=0.7 , application/json ; q=0.6"}, true},
		{"quoted comma", []string{`application/json;foo="a,application/problem+json",text/plain`}, false},
		{"quoted semicolon", []string{`application/problem+json;x="a;q=0";q=0.9`}, true},
		{"ext after q", []string{"application/problem+json;q=0.9;level=1"}, true},
		{"empty elements", []string{",, application/problem+json ,"}, true},
		{"no subtype", []string{"application"}, false},
		{"half wildcard", []string{"*/problem+json"}, false},
		{"suffix wildcard is not special", []string{"application/*+json"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := wantsProblem(tt.accept); got != tt.want {
				t.Errorf("wantsProblem(%q) = %v, want %v", tt.accept, got, tt.want)
			}
		})
	}
}

func TestParseQValue(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]int{"0": 0, "1": 1000, "0.5": 500, "0.25": 250, "0.125": 125, "1.0": 1000, "0.": 0} {
		if got, ok := parseQValue(in); !ok || got != want {
			t.Errorf("parseQValue(%q) = %d, %v; want %d", in, got, ok, want)
		}
	}
	for _, in := range []string{"", "2", "1.5", "1.001", "0.1234", ".5", "0,5", "-0", "01"} {
		if got, ok := parseQValue(in); ok {
			t.Errorf("parseQValue(%q) = %d, want error", in, got)
		}
	}
}

func FuzzAccept(f *testing.F) {
	for _, s := range []string{"", "*/*", "application/problem+json", "application/json;q=0.5, application/problem+json",
		`text/html;a="b,c\"";q=0.3`, "application/problem+json;q=0.", ";;;,,,", "a/b;q=1.000;q=0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, accept string) {
		lines := strings.Split(accept, "\n")
		got := wantsProblem(lines)
		if got && !strings.Contains(strings.ToLower(accept), "application/problem+json") {
			t.Fatalf("wantsProblem(%q) without naming problem+json", accept)
		}
		// Order of header lines may change which range is seen first but
		// not the answer: the best match is order-independent.
		if rev := slices.Clone(lines); len(rev) > 1 {
			slices.Reverse(rev)
			if wantsProblem(rev) != got {
				t.Fatalf("wantsProblem depends on line order for %q", accept)
			}
		}
	})
}
