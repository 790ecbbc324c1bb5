package httpguard

import (
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/tollgate/tollgate/guard"
)

// Prebuilt answers to the decisions the guard makes from its controls
// alone — 429 PENALTY and 403 KEY_BLOCKED for a blocklisted key — which are
// what a retry storm gets once it is penalised: the guard answers them from
// memory, without the store, so the HTTP layer should not spend more on
// them than net/http itself does. Their bodies depend only on the code, the
// body's format (JSON or problem+json), the Retry-After and, for the
// penalty ladder's answers, the level, end and reason they state, so each
// is built once and then written as is: no rendering, no allocation.

// answerSlots is the size of a middleware's cache of prebuilt answers. A
// penalty's Retry-After counts down one second at a time, so a few
// distinct values are live at once; a missed slot costs one build.
const answerSlots = 64

// Shared header values of prebuilt answers. net/http only reads a
// response's header values, and nothing edits the header of a response
// already written, so one slice serves every response.
var (
	valueJSON    = []string{contentTypeJSON}
	valueProblem = []string{contentTypeProblem}
	valueNosniff = []string{"nosniff"}
	valueClose   = []string{"close"}
)

// answer is one prebuilt answer. It is immutable once built.
type answer struct {
	// The cache key: code, problem+json, Retry-After, and for the penalty
	// ladder's answers the level, end and reason the body states.
	code    string
	problem bool
	retry   int64
	level   int
	until   int64
	reason  string

	status        int
	body          []byte
	contentType   []string
	contentLength []string
	retryAfter    []string // nil for a 403
}

// answers caches prebuilt answers; it is safe for concurrent use.
type answers struct {
	slots [answerSlots]atomic.Pointer[answer]
}

// prebuiltCode returns the API error code of a decision answered from the
// controls alone, or "" for any other decision.
func prebuiltCode(d *guard.Decision) string {
	if d.Deciding >= 0 || len(d.Rules) > 0 {
		return ""
	}
	switch {
	case d.Reason == guard.ReasonPenalty && d.Status == http.StatusTooManyRequests &&
		(d.Code == guard.CodePenalty || d.Code == ""):
		return guard.CodePenalty
	case d.Reason == guard.ReasonBlocklisted && d.Status == http.StatusForbidden &&
		(d.Code == guard.CodeKeyBlocked || d.Code == ""):
		return guard.CodeKeyBlocked
	}
	return ""
}

// get returns the prebuilt answer to d for r, building it on a miss, or
// nil when d is not a decision made from the controls alone.
func (a *answers) get(r *http.Request, d *guard.Decision) *answer {
	code := prebuiltCode(d)
	if code == "" {
		return nil
	}
	problem := wantsProblem(r.Header["Accept"])
	var retry int64
	if code == guard.CodePenalty {
		retry = retryAfter(d)
	}
	var until int64
	if d.PenaltyLevel > 0 {
		until = d.PenaltyUntil
	}
	i := uint64(retry)*4 + uint64(until/1_000_000)*8
	if code == guard.CodePenalty {
		i += 2
	}
	if problem {
		i++
	}
	slot := &a.slots[i%answerSlots]
	if p := slot.Load(); p != nil && p.code == code && p.problem == problem && p.retry == retry &&
		p.level == d.PenaltyLevel && p.until == until && p.reason == d.PenaltyReason {
		return p
	}
	p := buildAnswer(d, code, problem, retry)
	p.level, p.until, p.reason = d.PenaltyLevel, until, d.PenaltyReason
	slot.Store(p)
	return p
}

// buildAnswer renders the answer WriteDecision would write for d.
func buildAnswer(d *guard.Decision, code string, problem bool, retry int64) *answer {
	status := decisionStatus(d)
	var scratch [256]byte
	msg := decisionMessage(scratch[:0], d, code)
	var b []byte
	if problem {
		b = appendDecisionProblem(nil, d, status, code, msg)
	} else {
		b = appendDecisionJSON(nil, d, status, code, msg)
	}
	p := &answer{
		code: code, problem: problem, retry: retry,
		status:        status,
		body:          b,
		contentType:   valueJSON,
		contentLength: []string{strconv.Itoa(len(b))},
	}
	if problem {
		p.contentType = valueProblem
	}
	if status == http.StatusTooManyRequests {
		p.retryAfter = []string{strconv.FormatInt(retry, 10)}
	}
	return p
}

// write answers with p: the headers WriteDecision would set (no rate-limit
// headers, stale ones deleted; Retry-After on a 429), the status and the
// body.
func (p *answer) write(w http.ResponseWriter) {
	h := w.Header()
	for f := range numFields {
		if f != fRetryAfter {
			delete(h, headerNames[f].canon)
		}
	}
	if p.retryAfter != nil {
		h["Retry-After"] = p.retryAfter
	}
	h["Content-Type"] = p.contentType
	h["X-Content-Type-Options"] = valueNosniff
	h["Content-Length"] = p.contentLength
	w.WriteHeader(p.status)
	_, _ = w.Write(p.body)
}
