package adminapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/aggregator/internal/publish"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// maxRulesBody bounds a ruleset body.
const maxRulesBody = 1 << 20

// maxSmallBody bounds the JSON bodies of lists and overrides.
const maxSmallBody = 16 << 10

// Auditor appends audit entries (audit.Writer).
type Auditor interface {
	Write(ctx context.Context, e *tollgatev1.AuditEntry) error
}

// actor names who made a change: the X-Tollgate-Actor header (free text,
// e.g. an operator's name; the token authenticates) or "operator".
func actor(r *http.Request) string {
	if a := strings.TrimSpace(r.Header.Get("X-Tollgate-Actor")); a != "" && len(a) <= 128 {
		return a
	}
	return "operator"
}

func (a *api) kv(w http.ResponseWriter) *publish.KV {
	var kv *publish.KV
	if a.cfg.KV != nil {
		kv = a.cfg.KV()
	}
	if kv == nil {
		if a.cfg.KV == nil {
			Error(w, http.StatusServiceUnavailable, "NATS_NOT_CONFIGURED", "the control plane needs NATS: set TOLLGATE_NATS_URL")
		} else {
			Error(w, http.StatusServiceUnavailable, "NATS_UNAVAILABLE", "NATS JetStream is not reachable yet")
		}
		return nil
	}
	return kv
}

// record writes an audit entry; a failure is answered 500 (the change is
// applied: say so).
func (a *api) record(w http.ResponseWriter, r *http.Request, e *tollgatev1.AuditEntry) bool {
	e.Actor = actor(r)
	if err := a.cfg.Auditor.Write(r.Context(), e); err != nil {
		a.cfg.Log.Error("audit entry not written", slog.String("kind", e.Kind), slog.String("error", err.Error()))
		Error(w, http.StatusInternalServerError, "AUDIT_FAILED", "the change was applied but its audit entry could not be written to Kafka: "+err.Error())
		return false
	}
	return true
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// fieldError is one validation problem of a ruleset.
type fieldError struct {
	Rule    string `json:"rule,omitempty"`
	Field   string `json:"field,omitempty"`
	Line    int    `json:"line,omitempty"`
	Message string `json:"message"`
}

// invalidRules answers 400 with every problem of a refused ruleset.
func invalidRules(w http.ResponseWriter, err error) {
	var list []fieldError
	var walk func(error)
	walk = func(err error) {
		if j, ok := err.(interface{ Unwrap() []error }); ok {
			for _, e := range j.Unwrap() {
				walk(e)
			}
			return
		}
		var ve *rules.ValidationError
		if errors.As(err, &ve) {
			list = append(list, fieldError{Rule: ve.Rule, Field: ve.Field, Line: ve.Line, Message: ve.Msg})
			return
		}
		list = append(list, fieldError{Message: err.Error()})
	}
	walk(err)
	writeJSON(w, http.StatusBadRequest, map[string]any{"error": map[string]any{
		"code": "INVALID_RULES", "message": err.Error(), "details": list}})
}

func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			Error(w, http.StatusRequestEntityTooLarge, "BODY_TOO_LARGE", fmt.Sprintf("body larger than %d bytes", limit))
		} else {
			Error(w, http.StatusBadRequest, "INVALID_REQUEST", "reading the body failed")
		}
		return nil, false
	}
	return b, true
}

// ifMatch parses If-Match ("7" or "\"7\""); ok is false when absent.
func ifMatch(r *http.Request) (v int64, ok bool, err error) {
	s := strings.Trim(strings.TrimSpace(r.Header.Get("If-Match")), `"`)
	if s == "" {
		return 0, false, nil
	}
	v, err = strconv.ParseInt(s, 10, 64)
	if err != nil || v < 0 {
		return 0, true, errors.New("If-Match: want the version number you replace")
	}
	return v, true, nil
}

func (a *api) getRules(w http.ResponseWriter, r *http.Request) {
	kv := a.kv(w)
	if kv == nil {
		return
	}
	e, _, err := kv.ActiveRules(r.Context())
	if err != nil {
		Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
		return
	}
	if e == nil {
		Error(w, http.StatusNotFound, "NOT_FOUND", "no ruleset has been written yet")
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(e.Version, 10)))
	w.Header().Set("X-Tollgate-Rules-Version", strconv.FormatInt(e.Version, 10))
	if r.URL.Query().Get("format") == "entry" {
		writeJSON(w, http.StatusOK, e)
		return
	}
	if e.Format == "json" {
		w.Header().Set("Content-Type", "application/json")
	} else {
		w.Header().Set("Content-Type", "application/yaml")
	}
	_, _ = io.WriteString(w, e.Source)
}

func (a *api) validateRules(w http.ResponseWriter, r *http.Request) {
	body, ok := readBody(w, r, maxRulesBody)
	if !ok {
		return
	}
	rs, err := rules.Load(body)
	if err != nil {
		invalidRules(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"valid": true, "rules": len(rs.Rules()), "hash": rs.Hash()})
}

func (a *api) putRules(w http.ResponseWriter, r *http.Request) {
	kv := a.kv(w)
	if kv == nil {
		return
	}
	body, ok := readBody(w, r, maxRulesBody)
	if !ok {
		return
	}
	rs, err := rules.Load(body)
	if err != nil {
		invalidRules(w, err)
		return
	}
	format := "yaml"
	if strings.Contains(r.Header.Get("Content-Type"), "json") || strings.HasPrefix(strings.TrimSpace(string(body)), "{") {
		format = "json"
	}
	a.writeRules(w, r, string(body), format, rs, audit.KindRules, r.URL.Query().Get("reason"))
}

// writeRules makes src the active ruleset, version current + 1, honouring
// If-Match, and audits it.
func (a *api) writeRules(w http.ResponseWriter, r *http.Request, src, format string, rs *rules.Ruleset, kind, reason string) {
	kv := a.cfg.KV()
	want, conditional, err := ifMatch(r)
	if err != nil {
		Error(w, http.StatusBadRequest, "INVALID_REQUEST", err.Error())
		return
	}
	cur, rev, err := kv.ActiveRules(r.Context())
	if err != nil {
		Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
		return
	}
	var curVersion int64
	if cur != nil {
		curVersion = cur.Version
	}
	if conditional && want != curVersion {
		w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(curVersion, 10)))
		Error(w, http.StatusPreconditionFailed, "VERSION_MISMATCH",
			fmt.Sprintf("the rules are at version %d, not %d: another change came first", curVersion, want))
		return
	}
	e := &tollgatev1.RulesEntry{Version: curVersion + 1, Source: src, Format: format, Actor: actor(r), Reason: reason, Time: time.Now().UTC()}
	if _, err := kv.PutRules(r.Context(), e, rev); err != nil {
		if errors.Is(err, publish.ErrConflict) {
			Error(w, http.StatusPreconditionFailed, "VERSION_MISMATCH", "the rules changed meanwhile: read them again")
			return
		}
		Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
		return
	}
	before := map[string]any{"version": curVersion}
	if cur != nil {
		before["source"] = cur.Source
	}
	if !a.record(w, r, &tollgatev1.AuditEntry{Kind: kind, Subject: "rules", Reason: reason, Version: e.Version,
		Before: mustJSON(before), After: mustJSON(map[string]any{"version": e.Version, "hash": rs.Hash(), "source": src})}) {
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(e.Version, 10)))
	writeJSON(w, http.StatusOK, map[string]any{"version": e.Version, "hash": rs.Hash(), "rules": len(rs.Rules())})
}

func (a *api) rulesVersions(w http.ResponseWriter, r *http.Request) {
	kv := a.kv(w)
	if kv == nil {
		return
	}
	hist, err := kv.RulesVersions(r.Context())
	if err != nil {
		Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
		return
	}
	out := make([]map[string]any, 0, len(hist))
	for _, e := range hist {
		v := map[string]any{"version": e.Version, "time": e.Time, "actor": e.Actor, "reason": e.Reason}
		if rs, err := rules.Load([]byte(e.Source)); err == nil {
			v["hash"], v["rules"] = rs.Hash(), len(rs.Rules())
		}
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, map[string]any{"versions": out, "kept": publish.RulesHistory})
}

func (a *api) rollback(w http.ResponseWriter, r *http.Request) {
	kv := a.kv(w)
	if kv == nil {
		return
	}
	body, ok := readBody(w, r, maxSmallBody)
	if !ok {
		return
	}
	req, err := parseRollbackBody(body)
	if err != nil {
		Error(w, http.StatusBadRequest, "INVALID_REQUEST", err.Error())
		return
	}
	hist, err := kv.RulesVersions(r.Context())
	if err != nil {
		Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
		return
	}
	var found *tollgatev1.RulesEntry
	for _, e := range hist {
		if e.Version == req.Version {
			found = e
		}
	}
	if found == nil {
		Error(w, http.StatusNotFound, "NOT_FOUND", fmt.Sprintf("version %d is not in the kept history (GET /admin/v1/rules/versions)", req.Version))
		return
	}
	rs, err := rules.Load([]byte(found.Source))
	if err != nil {
		invalidRules(w, err)
		return
	}
	reason := req.Reason
	if reason == "" {
		reason = fmt.Sprintf("rollback to version %d", req.Version)
	}
	a.writeRules(w, r, found.Source, found.Format, rs, audit.KindRollback, reason)
}

// strictJSON decodes b into v refusing unknown fields and trailing data.
func strictJSON(b []byte, v any) error {
	dec := json.NewDecoder(strings.NewReader(string(b)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

// listBody is the body of PUT blocklist/{key} and allowlist/{key}.
type listBody struct {
	TTL    string `json:"ttl"`
	Reason string `json:"reason"`
}

// parseTTL parses a ttl ("" = none, else a duration of at least 1s and at
// most a year).
func parseTTL(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	d, err := rules.ParseDuration(s)
	if err != nil || d < time.Second || d > 366*24*time.Hour {
		return 0, fmt.Errorf("ttl %q: a duration from 1s to 366d, e.g. 10m", s)
	}
	return d, nil
}

func (a *api) putList(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		kv := a.kv(w)
		if kv == nil {
			return
		}
		id, prefix, ok := a.key(w, r)
		if !ok {
			return
		}
		body, ok := readBody(w, r, maxSmallBody)
		if !ok {
			return
		}
		req, ttl, err := parseListBody(body)
		if err != nil {
			Error(w, http.StatusBadRequest, "INVALID_REQUEST", err.Error())
			return
		}
		now := time.Now().UTC()
		e := &tollgatev1.ListEntry{KeyID: id, KeyPrefix: prefix, Action: action, Reason: req.Reason, Actor: actor(r), CreatedAt: now}
		if ttl > 0 {
			e.ExpiresAt = now.Add(ttl)
		}
		name, kind := tollgatev1.BlocklistKey(id), audit.KindBlocklist
		if action == tollgatev1.ActionAllow {
			name, kind = tollgatev1.AllowlistKey(id), audit.KindAllowlist
		}
		cur, rev, err := kv.List(r.Context(), name)
		if err != nil && rev == 0 {
			Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
			return
		}
		if _, err := kv.PutList(r.Context(), name, e, rev); err != nil {
			status, code := http.StatusBadGateway, "NATS_UNAVAILABLE"
			if errors.Is(err, publish.ErrConflict) {
				status, code = http.StatusConflict, "CONFLICT"
			}
			Error(w, status, code, err.Error())
			return
		}
		if !a.record(w, r, &tollgatev1.AuditEntry{Kind: kind, Subject: id, KeyPrefix: prefix, Reason: req.Reason,
			Before: mustJSON(cur), After: mustJSON(e)}) {
			return
		}
		if action == tollgatev1.ActionAllow {
			a.liftAllowlisted(r.Context(), id, actor(r))
		}
		writeJSON(w, http.StatusOK, e)
	}
}

func (a *api) deleteList(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		kv := a.kv(w)
		if kv == nil {
			return
		}
		id, prefix, ok := a.key(w, r)
		if !ok {
			return
		}
		name, kind := tollgatev1.BlocklistKey(id), audit.KindBlocklist
		if action == tollgatev1.ActionAllow {
			name, kind = tollgatev1.AllowlistKey(id), audit.KindAllowlist
		}
		cur, rev, err := kv.List(r.Context(), name)
		if err != nil && rev == 0 {
			Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
			return
		}
		if cur == nil || (action != tollgatev1.ActionAllow && cur.Action != action) {
			Error(w, http.StatusNotFound, "NOT_FOUND", "the key is not on the "+kind)
			return
		}
		if err := publish.Delete(r.Context(), kv.Lists, name, rev); err != nil {
			Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
			return
		}
		if !a.record(w, r, &tollgatev1.AuditEntry{Kind: kind, Subject: id, KeyPrefix: prefix, Reason: r.URL.Query().Get("reason"),
			Before: mustJSON(cur), After: []byte("null")}) {
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}

// overrideBody is the body of PUT overrides/{key}.
type overrideBody struct {
	Limit  *int64   `json:"limit"`
	Factor *float64 `json:"factor"`
	Rule   string   `json:"rule"`
	TTL    string   `json:"ttl"`
	Reason string   `json:"reason"`
}

// overrideSubject parses {key} of overrides: tenant:<name>, or a key.
func (a *api) overrideSubject(w http.ResponseWriter, r *http.Request) (scope, subject, prefix string, ok bool) {
	if t, isTenant := strings.CutPrefix(r.PathValue("key"), "tenant:"); isTenant {
		if t == "" || len(t) > 256 {
			Error(w, http.StatusBadRequest, "INVALID_REQUEST", "tenant: 1 to 256 bytes")
			return "", "", "", false
		}
		return tollgatev1.ScopeTenant, t, "", true
	}
	id, prefix, ok := a.key(w, r)
	return tollgatev1.ScopeKey, id, prefix, ok
}

func (a *api) putOverride(w http.ResponseWriter, r *http.Request) {
	kv := a.kv(w)
	if kv == nil {
		return
	}
	scope, subject, prefix, ok := a.overrideSubject(w, r)
	if !ok {
		return
	}
	body, ok := readBody(w, r, maxSmallBody)
	if !ok {
		return
	}
	req, ttl, err := parseOverrideBody(body)
	if err != nil {
		Error(w, http.StatusBadRequest, "INVALID_REQUEST", err.Error())
		return
	}
	want, conditional, err := ifMatch(r)
	if err != nil {
		Error(w, http.StatusBadRequest, "INVALID_REQUEST", err.Error())
		return
	}
	name := tollgatev1.OverrideKey(scope, subject)
	cur, rev, err := kv.Override(r.Context(), name)
	if err != nil && rev == 0 {
		Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
		return
	}
	if conditional && uint64(want) != rev {
		w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(rev, 10)))
		Error(w, http.StatusPreconditionFailed, "VERSION_MISMATCH", fmt.Sprintf("the override is at version %d, not %d", rev, want))
		return
	}
	now := time.Now().UTC()
	e := &tollgatev1.OverrideEntry{Scope: scope, Subject: subject, KeyPrefix: prefix, Rule: req.Rule, Reason: req.Reason,
		Actor: actor(r), CreatedAt: now}
	if req.Limit != nil {
		e.Limit = *req.Limit
	} else {
		e.Factor = *req.Factor
	}
	if ttl > 0 {
		e.ExpiresAt = now.Add(ttl)
	}
	nrev, err := kv.PutOverride(r.Context(), name, e, rev)
	if err != nil {
		if errors.Is(err, publish.ErrConflict) {
			Error(w, http.StatusPreconditionFailed, "VERSION_MISMATCH", "the override changed meanwhile: read it again")
			return
		}
		Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
		return
	}
	if !a.record(w, r, &tollgatev1.AuditEntry{Kind: audit.KindOverride, Subject: subject, KeyPrefix: prefix, Reason: req.Reason,
		Before: mustJSON(cur), After: mustJSON(e), Version: int64(nrev)}) {
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(nrev, 10)))
	writeJSON(w, http.StatusOK, map[string]any{"version": nrev, "override": e})
}

func (a *api) deleteOverride(w http.ResponseWriter, r *http.Request) {
	kv := a.kv(w)
	if kv == nil {
		return
	}
	scope, subject, prefix, ok := a.overrideSubject(w, r)
	if !ok {
		return
	}
	name := tollgatev1.OverrideKey(scope, subject)
	cur, rev, err := kv.Override(r.Context(), name)
	if err != nil && rev == 0 {
		Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
		return
	}
	if cur == nil {
		Error(w, http.StatusNotFound, "NOT_FOUND", "no override")
		return
	}
	want, conditional, err := ifMatch(r)
	if err != nil || (conditional && uint64(want) != rev) {
		Error(w, http.StatusPreconditionFailed, "VERSION_MISMATCH", fmt.Sprintf("the override is at version %d", rev))
		return
	}
	if err := publish.Delete(r.Context(), kv.Overrides, name, rev); err != nil {
		Error(w, http.StatusBadGateway, "NATS_UNAVAILABLE", err.Error())
		return
	}
	if !a.record(w, r, &tollgatev1.AuditEntry{Kind: audit.KindOverride, Subject: subject, KeyPrefix: prefix,
		Reason: r.URL.Query().Get("reason"), Before: mustJSON(cur), After: []byte("null")}) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// key reads {key}: the key_id and the key's prefix for humans ("" for a
// kid:).
func (a *api) key(w http.ResponseWriter, r *http.Request) (id, prefix string, ok bool) {
	k := r.PathValue("key")
	id, ok = subject(a.cfg.Hasher, k)
	if !ok {
		Error(w, http.StatusBadRequest, "INVALID_KEY", "{key}: an API key (at most 256 bytes) or kid:<key_id>")
		return "", "", false
	}
	if !strings.HasPrefix(k, "kid:") {
		prefix = keyid.Prefix(k)
	}
	return id, prefix, true
}

// rollbackBody is the body of POST rules/rollback.
type rollbackBody struct {
	Version int64  `json:"version"`
	Reason  string `json:"reason"`
}

func parseRollbackBody(b []byte) (rollbackBody, error) {
	var req rollbackBody
	if err := strictJSON(b, &req); err != nil || req.Version < 1 {
		return req, errors.New(`body: {"version": N} with N ≥ 1, "reason" optional`)
	}
	return req, nil
}

// maxReason bounds a reason's length.
const maxReason = 1024

func parseListBody(b []byte) (listBody, time.Duration, error) {
	var req listBody
	if len(strings.TrimSpace(string(b))) > 0 {
		if err := strictJSON(b, &req); err != nil {
			return req, 0, fmt.Errorf(`body: {"ttl": "10m", "reason": "…"} (both optional): %w`, err)
		}
	}
	if len(req.Reason) > maxReason {
		return req, 0, fmt.Errorf("reason: at most %d bytes", maxReason)
	}
	ttl, err := parseTTL(req.TTL)
	return req, ttl, err
}

func parseOverrideBody(b []byte) (overrideBody, time.Duration, error) {
	var req overrideBody
	if err := strictJSON(b, &req); err != nil {
		return req, 0, fmt.Errorf(`body: {"limit": N} or {"factor": F}, with "ttl", "reason" and "rule" optional: %w`, err)
	}
	if (req.Limit == nil) == (req.Factor == nil) || (req.Limit != nil && (*req.Limit < 1 || *req.Limit > 1<<40)) ||
		(req.Factor != nil && !(*req.Factor > 0 && *req.Factor <= 1e6)) {
		return req, 0, errors.New("exactly one of limit (an integer from 1 to 2^40) and factor (a number in (0, 1e6])")
	}
	if len(req.Reason) > maxReason || len(req.Rule) > 256 {
		return req, 0, fmt.Errorf("reason: at most %d bytes; rule: at most 256", maxReason)
	}
	ttl, err := parseTTL(req.TTL)
	return req, ttl, err
}
