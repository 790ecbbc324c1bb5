package loadtest

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/httpguard"
	"github.com/tollgate/tollgate/loadtest/internal/testtarget"
)

// TestRunMarksPenaltyAnswers: answers of the penalty ladder, in the
// gateway's own words, are counted apart from a rule's 429 and an
// operator's 403, and the summary says what they mean, in text, JSON and
// the HTML page alike.
func TestRunMarksPenaltyAnswers(t *testing.T) {
	t.Parallel()
	decisions := map[string]guard.Decision{
		"sk_load_1": {Status: 429, Code: guard.CodeRateLimitExceeded, Reason: guard.ReasonRateLimited, RetryAfter: 7,
			Deciding: 0, Rules: []guard.RuleResult{{ID: "per-key", Limit: 5, Window: 60, RetryAfter: 7}}},
		"sk_load_2": {Status: 429, Code: guard.CodePenalty, Reason: guard.ReasonPenalty, Deciding: -1, RetryAfter: 900,
			PenaltyLevel: 2, PenaltyReason: "20 of 20 requests in 60s arrived while a Retry-After was running (100%)"},
		"sk_load_3": {Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1,
			PenaltyLevel: 3, PenaltyUntil: time.Now().Add(24 * time.Hour).UnixMicro()},
		"sk_load_4": {Status: 403, Code: guard.CodeKeyBlocked, Reason: guard.ReasonBlocklisted, Deciding: -1},
	}
	srv := testtarget.StartHTTP(t, func(w http.ResponseWriter, r *http.Request, key string, _ int64) {
		if d, ok := decisions[key]; ok {
			httpguard.WriteDecision(w, r, &d)
		}
	})
	cfg := DefaultConfig()
	cfg.URL, cfg.Keys, cfg.Workers, cfg.Requests = srv.URL, 5, 4, 500
	s, err := Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	byKey := srv.ByKey()
	want := map[string]int64{"2xx": byKey["sk_load_0"], "429": byKey["sk_load_1"], "429 PENALTY": byKey["sk_load_2"],
		"403 PENALTY": byKey["sk_load_3"], "403": byKey["sk_load_4"]}
	for name, n := range want {
		if s.Statuses[name] != n || n == 0 {
			t.Errorf("%s: %d answers, the target gave %d", name, s.Statuses[name], n)
		}
	}
	if s.PenaltyAnswers != byKey["sk_load_2"]+byKey["sk_load_3"] {
		t.Errorf("penalty answers %d, want %d", s.PenaltyAnswers, byKey["sk_load_2"]+byKey["sk_load_3"])
	}
	var text, js, page bytes.Buffer
	if err := s.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"came from the penalty ladder", "TOLLGATE_PENALTY_MODE=off", "429 PENALTY=", "403 PENALTY="} {
		if !strings.Contains(text.String(), w) {
			t.Errorf("summary lacks %q:\n%s", w, text.String())
		}
	}
	if err := s.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var m struct {
		PenaltyAnswers int64 `json:"penalty_answers"`
	}
	if err := json.Unmarshal(js.Bytes(), &m); err != nil || m.PenaltyAnswers != s.PenaltyAnswers {
		t.Errorf("JSON penalty_answers %d (%v), want %d", m.PenaltyAnswers, err, s.PenaltyAnswers)
	}
	if err := s.WriteHTML(&page); err != nil || !strings.Contains(page.String(), "came from the penalty ladder") {
		t.Errorf("HTML page without the penalty line (%v)", err)
	}

	// A run without them says nothing of the ladder.
	cfg.Keys, cfg.Requests = 1, 20
	s, err = Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	text.Reset()
	if err := s.WriteText(&text); err != nil || strings.Contains(text.String(), "penalty ladder") {
		t.Errorf("a run without penalty answers mentions the ladder (%v):\n%s", err, text.String())
	}
}
