package adminapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// Audit before effect.
//
// Every change the operator API makes — rules, lists, overrides, a key's
// counters — is written to the audit log first: its entry (who, why,
// before and after) is appended to the audit topic and acknowledged, and
// only then is the change put in force. A change whose entry cannot be
// written does not happen (503 AUDIT_FAILED). When the change then fails
// (NATS refuses it, another writer came first, Redis fails) a second
// entry of the same kind and subject follows: "not applied (audit entry
// <id>): <why>", with before and after swapped, so the log's sequence of
// states stays true; or "outcome unknown (audit entry <id>)" when the
// answer was lost and reading the entry back failed. Gateways therefore
// never enforce a change the audit log does not hold.
//
// Audit entries always fit the audit topic (1 MiB per record by Kafka's
// default): an entry above maxAuditEntry keeps, for a ruleset, its
// version, hash (the hex SHA-256 of its source, as GET rules/versions
// shows it) and size, and loses the source itself (before's first); any
// other part still too large is replaced by its size and SHA-256.

// Bounds.
const (
	// maxAuditEntry bounds an audit entry's encoded size, well under the
	// audit topic's record limit (1 MiB by default).
	maxAuditEntry = 768 << 10
	// writeAttempts bounds how often a write without If-Match is retried
	// after another writer came first: an unconditional write means
	// "whatever is there", so losing such a race is not the caller's
	// business.
	writeAttempts = 5
	// applyTimeout bounds putting a change in force once its audit entry
	// is written. The request's context is not used: a client that goes
	// away does not stop a change half-way.
	applyTimeout = 10 * time.Second
)

// Auditor appends audit entries (audit.Writer).
type Auditor interface {
	Write(ctx context.Context, e *tollgatev1.AuditEntry) error
}

// Errors of apply.
var (
	// errAudit: the audit entry was not written; nothing was done.
	errAudit = errors.New("adminapi: audit entry not written")
	// errMaybeApplied wraps the failure of a change that may have taken
	// effect in part (a Redis call that failed after being sent).
	errMaybeApplied = errors.New("adminapi: the change may have taken effect")
)

// Outcomes of a change that failed after its audit entry was written.
const (
	outcomeNotApplied = "not applied"
	outcomeUnknown    = "outcome unknown"
)

// apply writes e, the change's intent, to the audit log and then runs do,
// which puts it in force. When do fails, a follow-up entry records the
// outcome and do's error is returned; when the audit entry cannot be
// written, do is not run and the error wraps errAudit.
func (a *api) apply(r *http.Request, e *tollgatev1.AuditEntry, do func(ctx context.Context) error) error {
	e.Actor = actor(r)
	e.OriginRegion = originOf(r.Context())
	fitAudit(e)
	if err := a.cfg.Auditor.Write(r.Context(), e); err != nil {
		a.cfg.Log.Error("change refused: its audit entry could not be written", slog.String("kind", e.Kind),
			slog.String("subject", e.Subject), slog.String("error", err.Error()))
		return fmt.Errorf("%w: %w", errAudit, err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), applyTimeout)
	defer cancel()
	err := do(ctx)
	if err == nil {
		return nil
	}
	outcome := outcomeNotApplied
	if errors.Is(err, fleetkv.ErrUnknownOutcome) || errors.Is(err, errMaybeApplied) {
		outcome = outcomeUnknown
	}
	f := &tollgatev1.AuditEntry{Actor: e.Actor, Kind: e.Kind, Subject: e.Subject, KeyPrefix: e.KeyPrefix, OriginRegion: e.OriginRegion,
		Reason: fmt.Sprintf("%s (audit entry %s): %v", outcome, e.Id, err)}
	if outcome == outcomeNotApplied {
		f.Before, f.After = e.After, e.Before
	}
	fitAudit(f)
	if ferr := a.cfg.Auditor.Write(ctx, f); ferr != nil {
		a.cfg.Log.Error("the audit log holds a change without its outcome: the follow-up entry could not be written",
			slog.String("audit_id", e.Id), slog.String("outcome", outcome), slog.String("error", ferr.Error()))
	}
	return err
}

// errAnswered is returned by a write attempt (see retryWrite) that has
// answered the request itself: a failed read, a failed precondition.
var errAnswered = errors.New("adminapi: request answered")

// lostRace is what a conditional write answers when another writer changed
// the entry between its read and its write.
type lostRace struct {
	// retry: read again and retry, up to writeAttempts in all, before
	// answering (a write without If-Match).
	retry  bool
	status int
	code   string
	msg    string
}

// retryWrite runs attempt, one read-check-write of an entry ending in
// apply, until it succeeds or answers. A lost race is retried or answered
// as lost says; any other failure is answered by changeFailed. It reports
// whether the write succeeded; when it did not, the request is answered.
func retryWrite(w http.ResponseWriter, lost lostRace, attempt func() error) bool {
	for n := 1; ; n++ {
		err := attempt()
		switch {
		case err == nil:
			return true
		case errors.Is(err, errAnswered):
			return false
		case errors.Is(err, fleetkv.ErrConflict):
			if lost.retry && n < writeAttempts {
				continue
			}
			apierror.Write(w, lost.status, lost.code, lost.msg)
			return false
		default:
			changeFailed(w, err, apierror.NATSUnavailable)
			return false
		}
	}
}

// changeFailed answers a change apply returned err for (not a lost race:
// callers answer those). code is the answer for a plain failure of the
// store the change went to.
func changeFailed(w http.ResponseWriter, err error, code string) {
	switch {
	case errors.Is(err, errAudit):
		apierror.Write(w, http.StatusServiceUnavailable, apierror.AuditFailed,
			"nothing was changed: the change's audit entry could not be written to Kafka: "+err.Error())
	case errors.Is(err, fleetkv.ErrTooLarge):
		apierror.Write(w, http.StatusRequestEntityTooLarge, apierror.RulesTooLarge, err.Error())
	case errors.Is(err, fleetkv.ErrUnknownOutcome), errors.Is(err, errMaybeApplied):
		apierror.Write(w, http.StatusBadGateway, apierror.OutcomeUnknown,
			"the change may or may not have taken effect: read it again (the audit log records this): "+err.Error())
	case code == apierror.RedisUnavailable:
		apierror.Write(w, http.StatusServiceUnavailable, code, err.Error())
	default:
		apierror.Write(w, http.StatusBadGateway, code, err.Error())
	}
}

// fitAudit bounds e to maxAuditEntry (see "Audit before effect").
func fitAudit(e *tollgatev1.AuditEntry) {
	if proto.Size(e) <= maxAuditEntry {
		return
	}
	for _, p := range []*[]byte{&e.Before, &e.After} {
		*p = dropSource(*p)
		if proto.Size(e) <= maxAuditEntry {
			return
		}
	}
	for _, p := range []*[]byte{&e.Before, &e.After} {
		if len(*p) > 1<<10 {
			*p = digest(*p)
			if proto.Size(e) <= maxAuditEntry {
				return
			}
		}
	}
}

// dropSource removes "source" from a JSON object holding a ruleset (its
// "hash" and "bytes" stay), marking it "source_omitted".
func dropSource(b []byte) []byte {
	var m map[string]json.RawMessage
	if json.Unmarshal(b, &m) != nil {
		return b
	}
	if _, ok := m["source"]; !ok {
		return b
	}
	delete(m, "source")
	m["source_omitted"] = json.RawMessage(`"too large for the audit log: the hash identifies it"`)
	out, err := json.Marshal(m)
	if err != nil {
		return b
	}
	return out
}

// digest replaces a JSON document by its size and SHA-256.
func digest(b []byte) []byte {
	sum := sha256.Sum256(b)
	return mustJSON(map[string]any{"omitted": "too large for the audit log", "bytes": len(b), "sha256": hex.EncodeToString(sum[:])})
}

// corruptState is the audit log's before of a corrupt entry.
func corruptState(ce *fleetkv.CorruptError) []byte {
	return mustJSON(map[string]any{"corrupt": true, "revision": ce.Revision, "bytes": ce.Bytes, "sha256": ce.SHA256,
		"cause": ce.Err.Error()})
}

// corruptAnswer answers 409 code for a corrupt entry, with what identifies
// it, its revision as the ETag (etag), and how to repair it.
func corruptAnswer(w http.ResponseWriter, code, etag string, ce *fleetkv.CorruptError, repair string) {
	w.Header().Set("ETag", strconv.Quote(etag))
	msg := fmt.Sprintf("the %s entry %q in NATS (revision %d, %d bytes) is corrupt: %v. %s", ce.Bucket, ce.Key,
		ce.Revision, ce.Bytes, ce.Err, repair)
	writeJSON(w, http.StatusConflict, apierror.Value(code, msg, map[string]any{
		"revision": ce.Revision, "bytes": ce.Bytes, "sha256": ce.SHA256, "cause": ce.Err.Error()}))
}

// precondition is a request's If-Match.
type precondition struct {
	set bool
	// version: a ruleset version, or an override's revision ("7").
	version int64
	// rev: a corrupt entry's KV revision ("r7"); 0 for a version.
	rev uint64
}

// ifMatch parses If-Match: "7", or "r7" for the corrupt entry at revision
// 7 (quotes optional).
func ifMatch(r *http.Request) (precondition, error) {
	s := strings.Trim(strings.TrimSpace(r.Header.Get("If-Match")), `"`)
	if s == "" {
		return precondition{}, nil
	}
	if rs, ok := strings.CutPrefix(s, "r"); ok {
		rev, err := strconv.ParseUint(rs, 10, 64)
		if err != nil || rev == 0 {
			return precondition{}, errors.New(`If-Match: want the version you replace, or r<revision> for a corrupt entry`)
		}
		return precondition{set: true, version: -1, rev: rev}, nil
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return precondition{}, errors.New(`If-Match: want the version you replace, or r<revision> for a corrupt entry`)
	}
	return precondition{set: true, version: v}, nil
}

// revision is what an override's If-Match names: a KV revision, written
// "7" or "r7".
func (p precondition) revision() uint64 {
	if p.rev != 0 {
		return p.rev
	}
	return uint64(p.version)
}

// natsFailed answers a failed read or write of the fleet configuration in
// NATS (502 NATS_UNAVAILABLE).
func natsFailed(w http.ResponseWriter, err error) {
	apierror.Write(w, http.StatusBadGateway, apierror.NATSUnavailable, err.Error())
}

// badRequest answers 400 INVALID_REQUEST with err as the message.
func badRequest(w http.ResponseWriter, err error) {
	apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, err.Error())
}

// beginConditional opens a write that honours If-Match: it parses the
// precondition and takes the write semaphore (call unlock when ok). When
// ok is false the request is answered.
func (a *api) beginConditional(w http.ResponseWriter, r *http.Request) (pre precondition, unlock func(), ok bool) {
	pre, err := ifMatch(r)
	if err != nil {
		badRequest(w, err)
		return pre, nil, false
	}
	unlock, ok = a.lockWrites(w, r)
	return pre, unlock, ok
}

// replacedState is the audit's before of the entry a write replaces, read
// as cur with err: its JSON, or what is known of a corrupt one (the write
// repairs it). When the read failed it answers and returns errAnswered.
func replacedState(w http.ResponseWriter, cur any, err error) ([]byte, error) {
	var ce *fleetkv.CorruptError
	switch {
	case errors.As(err, &ce):
		return corruptState(ce), nil
	case err != nil:
		natsFailed(w, err)
		return nil, errAnswered
	}
	return mustJSON(cur), nil
}

// removedState is the audit's before of the entry a delete removes, read
// as cur with err; present says whether cur is there to delete (a corrupt
// entry always is). An absent entry is answered 404 with absent as the
// message; a failed read is answered too; both return errAnswered.
func removedState(w http.ResponseWriter, cur any, present bool, err error, absent string) ([]byte, error) {
	if err != nil {
		return replacedState(w, cur, err)
	}
	if !present {
		apierror.Write(w, http.StatusNotFound, apierror.NotFound, absent)
		return nil, errAnswered
	}
	return mustJSON(cur), nil
}
