package checkapi

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"net/http"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/httpguard"
	"github.com/tollgate/tollgate/guard/rules"
)

// FuzzFastBody: whatever the hand decoder accepts, it decodes exactly as
// encoding/json does.
func FuzzFastBody(f *testing.F) {
	for _, s := range []string{
		`{"api_key":"sk_1","endpoint":"/v1/x","method":"GET","cost":3,"tenant":"acme","ip":"2001:db8::1"}`,
		` { "cost" : 0 } `, `{}`, `{"cost":-1}`, `{"cost":01}`, `{"cost":1.5}`, `{"cost":1e3}`,
		`{"api_key":"a","api_key":"b"}`, `{"api_key":"\u0041"}`, `{"api_key":"k\xff"}`, `{"method":"G\xffT"}`,
		`{"api_key":null}`, `{"x":1}`, `{"cost":99999999999999999999}`, `{"api_key":"a"} x`, `{"api_key":"a",}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var b checkBody
		if !fastBody(data, &b) {
			return
		}
		got, gotPeek, gotErr := b.request()
		want, wantPeek, wantErr := decodeStrict(data)
		if (gotErr == nil) != (wantErr == nil) || (gotErr != nil && gotErr.Error() != wantErr.Error()) {
			t.Fatalf("%q: error %v, encoding/json %v", data, gotErr, wantErr)
		}
		if gotErr == nil && (gotPeek != wantPeek || got.Key != want.Key || got.Path != want.Path || got.Method != want.Method ||
			got.Tenant != want.Tenant || got.IP != want.IP || got.Cost != want.Cost) {
			t.Fatalf("%q: %+v %v, encoding/json %+v %v", data, got, gotPeek, want, wantPeek)
		}
	})
}

// referenceDecision is appendDecision through encoding/json: the layout
// the check API documents (decisionJSON).
func referenceDecision(d *guard.Decision, status int) []byte {
	j := decisionJSON{Allowed: d.Allowed, Status: status, RetryAfter: d.RetryAfter, Degraded: d.Degraded, Reason: string(d.Reason)}
	dr := d.DecidingRule()
	if dr != nil {
		j.Limit, j.Remaining, j.Reset = dr.Limit, max(dr.Remaining, 0), dr.Reset
		if dr.FailOpen {
			j.Remaining = -1
		}
		j.Rule, j.Algorithm = dr.ID, string(dr.Algorithm)
	}
	if !d.Allowed {
		code := d.Code
		if code == "" {
			code = guard.CodeRateLimitExceeded
		}
		j.Error = &errorJSON{Code: code, Message: httpguard.Message(d)}
		if status == http.StatusTooManyRequests && dr != nil {
			j.Error.Details = &detailsJSON{Rule: dr.ID, Limit: dr.Limit, WindowSeconds: dr.Window,
				RetryAfterSeconds: d.RetryAfter, ResetAt: time.Unix(dr.Reset, 0).UTC().Format(time.RFC3339)}
		} else if dr == nil && d.PenaltyLevel > 0 && (code == guard.CodePenalty ||
			(code == guard.CodeKeyBlocked && d.Reason == guard.ReasonBlocklisted)) {
			pd := &penaltyDetailsJSON{PenaltyLevel: d.PenaltyLevel, PenaltyReason: d.PenaltyReason}
			if code == guard.CodePenalty {
				ra := max(d.RetryAfter, 1)
				pd.RetryAfterSeconds = &ra
			}
			if d.PenaltyUntil > 0 && d.PenaltyUntil < math.MaxInt64 {
				pd.ExpiresAt = time.Unix((d.PenaltyUntil+999_999)/1_000_000, 0).UTC().Format(time.RFC3339)
			}
			j.Error.Details = pd
		}
	}
	out, _ := json.Marshal(&j)
	return out
}

// TestAppendDecisionMatchesJSON: the hand encoder writes every decision
// byte for byte as encoding/json does, odd strings included.
func TestAppendDecisionMatchesJSON(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	odd := []string{"per-key", "", "a<b>&c", "q\"uo\\te", "tab\tnl\n\b\f\r\x01\x1f", "\u2028\u2029", "k\xff\xfe", "日本", "\u007f"}
	statuses := []int{200, 429, 403, 400, 500}
	for i := range 5000 {
		d := &guard.Decision{
			Allowed:    rng.IntN(2) == 0,
			Degraded:   rng.IntN(4) == 0,
			Reason:     guard.Reason(odd[rng.IntN(len(odd))]),
			Code:       []string{"", guard.CodeRateLimitExceeded, guard.CodeKeyBlocked, guard.CodePenalty, guard.CodeCostExceedsLimit}[rng.IntN(5)],
			RetryAfter: rng.Int64N(100),
			Deciding:   -1,
			Cost:       1 + rng.Int64N(5),
		}
		if rng.IntN(3) == 0 { // an answer of the penalty ladder
			d.Reason = []guard.Reason{guard.ReasonPenalty, guard.ReasonBlocklisted}[rng.IntN(2)]
			d.PenaltyLevel = 1 + rng.IntN(3)
			d.PenaltyReason = odd[rng.IntN(len(odd))]
			d.PenaltyUntil = []int64{0, math.MaxInt64, 1_795_398_524_000_001}[rng.IntN(3)]
		}
		if rng.IntN(5) > 0 {
			d.Rules = []guard.RuleResult{{
				ID: odd[rng.IntN(len(odd))], Algorithm: rules.Algorithm(odd[rng.IntN(len(odd))]),
				Limit: rng.Int64N(1e6), Remaining: rng.Int64N(2e6) - 1e6, Window: rng.Int64N(3600),
				Reset: rng.Int64N(2e9), FailOpen: rng.IntN(6) == 0,
			}}
			d.Deciding = 0
		}
		status := statuses[rng.IntN(len(statuses))]
		got, want := appendDecision(nil, d, status), referenceDecision(d, status)
		if string(got) != string(want) {
			t.Fatalf("decision %d:\n got %s\nwant %s", i, got, want)
		}
	}
}
