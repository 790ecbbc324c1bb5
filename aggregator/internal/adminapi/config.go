package adminapi

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// maxRulesBody bounds a ruleset's source: 512 KiB, so that its KV value
// fits NATS (1 MiB by default) and its audit entry the audit topic.
const maxRulesBody = 512 << 10

// maxSmallBody bounds the JSON bodies of lists and overrides.
const maxSmallBody = 16 << 10

// actor names who made a change: the X-Tollgate-Actor header (free text,
// e.g. an operator's name; the token authenticates) or "operator".
func actor(r *http.Request) string {
	if a := strings.TrimSpace(r.Header.Get("X-Tollgate-Actor")); a != "" && len(a) <= 128 {
		return a
	}
	return "operator"
}

func (a *api) kv(w http.ResponseWriter) *fleetkv.KV {
	var kv *fleetkv.KV
	if a.cfg.KV != nil {
		kv = a.cfg.KV()
	}
	if kv == nil {
		if a.cfg.KV == nil {
			apierror.Write(w, http.StatusServiceUnavailable, apierror.NATSNotConfigured, "the control plane needs NATS: set TOLLGATE_NATS_URL")
		} else {
			apierror.Write(w, http.StatusServiceUnavailable, apierror.NATSUnavailable, "NATS JetStream is not reachable yet")
		}
		return nil
	}
	return kv
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// fieldError is one validation problem (or warning) of a ruleset.
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
	writeJSON(w, http.StatusBadRequest, apierror.Value(apierror.InvalidRules, err.Error(), map[string]any{"details": list}))
}

// rulesAnswer is the answer of a ruleset accepted (PUT, rollback,
// validate): what allow_total_block let through is under "warnings".
func rulesAnswer(rs *rules.Ruleset, fields map[string]any) map[string]any {
	fields["hash"], fields["rules"] = rs.Hash(), len(rs.Rules())
	if ws := rs.Warnings(); len(ws) > 0 {
		list := make([]fieldError, 0, len(ws))
		for _, w := range ws {
			list = append(list, fieldError{Rule: w.Rule, Field: w.Field, Line: w.Line, Message: w.Msg})
		}
		fields["warnings"] = list
	}
	return fields
}

func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, bool) {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		var mb *http.MaxBytesError
		if errors.As(err, &mb) {
			apierror.Write(w, http.StatusRequestEntityTooLarge, apierror.BodyTooLarge, fmt.Sprintf("body larger than %d bytes", limit))
		} else {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "reading the body failed")
		}
		return nil, false
	}
	return b, true
}

// rulesState is a ruleset as the audit log's before and after show it:
// its version, hash (hex SHA-256 of the source), size and source (dropped
// when the entry would not fit the audit topic).
func rulesState(version int64, src string) []byte {
	sum := sha256.Sum256([]byte(src))
	return mustJSON(map[string]any{"version": version, "hash": hex.EncodeToString(sum[:]), "bytes": len(src), "source": src})
}

// corruptRules answers the corrupt active ruleset entry.
func corruptRules(w http.ResponseWriter, ce *fleetkv.CorruptError) {
	corruptAnswer(w, apierror.RulesCorrupt, fmt.Sprintf("r%d", ce.Revision), ce, fmt.Sprintf(
		"Gateways keep the rules they enforce. Replace it: PUT /admin/v1/rules with If-Match: r%d, or roll back to a good version (GET /admin/v1/rules/versions).",
		ce.Revision))
}

func (a *api) getRules(w http.ResponseWriter, r *http.Request) {
	kv := a.kv(w)
	if kv == nil {
		return
	}
	e, _, err := kv.ActiveRules(r.Context())
	var ce *fleetkv.CorruptError
	switch {
	case errors.As(err, &ce):
		corruptRules(w, ce)
		return
	case err != nil:
		natsFailed(w, err)
		return
	case e == nil:
		apierror.Write(w, http.StatusNotFound, apierror.NotFound, "no ruleset has been written yet")
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
	_, rs, ok := readRules(w, r)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, rulesAnswer(rs, map[string]any{"valid": true}))
}

// readRequest reads a small request body and parses it with parse; when
// ok is false it has answered the request instead (a body too large or
// unreadable, or one parse refuses: 400 with parse's error).
func readRequest[T any](w http.ResponseWriter, r *http.Request, parse func([]byte) (T, error)) (req T, ok bool) {
	body, ok := readBody(w, r, maxSmallBody)
	if !ok {
		return req, false
	}
	req, err := parse(body)
	if err != nil {
		badRequest(w, err)
		return req, false
	}
	return req, true
}

// readRules reads a ruleset from the request body; ok is false when it
// has answered the request instead (a body too large or unreadable, a
// ruleset that does not load).
func readRules(w http.ResponseWriter, r *http.Request) (body []byte, rs *rules.Ruleset, ok bool) {
	body, ok = readBody(w, r, maxRulesBody)
	if !ok {
		return nil, nil, false
	}
	rs, err := rules.Load(body)
	if err != nil {
		invalidRules(w, err)
		return nil, nil, false
	}
	return body, rs, true
}

func (a *api) putRules(w http.ResponseWriter, r *http.Request) {
	kv := a.kv(w)
	if kv == nil {
		return
	}
	body, rs, ok := readRules(w, r)
	if !ok {
		return
	}
	format := "yaml"
	if strings.Contains(r.Header.Get("Content-Type"), "json") || strings.HasPrefix(strings.TrimSpace(string(body)), "{") {
		format = "json"
	}
	a.writeRules(w, r, kv, string(body), format, rs, audit.KindRules, r.URL.Query().Get("reason"))
}

// newestVersion is the highest version among the history's entries that
// decode: what a write over a corrupt active entry counts from.
func newestVersion(ctx context.Context, kv *fleetkv.KV) (int64, error) {
	hist, err := kv.RulesVersions(ctx)
	if err != nil {
		return 0, err
	}
	var v int64
	for _, h := range hist {
		if h.Entry != nil {
			v = max(v, h.Entry.Version)
		}
	}
	return v, nil
}

// writeRules makes src the active ruleset, version current + 1, honouring
// If-Match (a version, or r<revision> over a corrupt entry), audited
// before it takes effect. Without If-Match a write that another writer
// beat is retried on the new current version.
func (a *api) writeRules(w http.ResponseWriter, r *http.Request, kv *fleetkv.KV, src, format string, rs *rules.Ruleset, kind, reason string) {
	pre, unlock, ok := a.beginConditional(w, r)
	if !ok {
		return
	}
	defer unlock()
	var e *tollgatev1.RulesEntry
	lost := lostRace{retry: !pre.set, status: http.StatusPreconditionFailed, code: apierror.VersionMismatch,
		msg: "the rules changed meanwhile: read them again"}
	if !retryWrite(w, lost, func() error {
		cur, rev, err := kv.ActiveRules(r.Context())
		var ce *fleetkv.CorruptError
		isCorrupt := errors.As(err, &ce)
		if err != nil && !isCorrupt {
			natsFailed(w, err)
			return errAnswered
		}
		var curVersion int64
		before := mustJSON(map[string]any{"version": 0})
		switch {
		case isCorrupt:
			if curVersion, err = newestVersion(r.Context(), kv); err != nil {
				natsFailed(w, err)
				return errAnswered
			}
			before = corruptState(ce)
		case cur != nil:
			curVersion, before = cur.Version, rulesState(cur.Version, cur.Source)
		}
		switch {
		case pre.set && isCorrupt && pre.rev != ce.Revision:
			w.Header().Set("ETag", strconv.Quote(fmt.Sprintf("r%d", ce.Revision)))
			apierror.Write(w, http.StatusPreconditionFailed, apierror.RulesCorrupt, fmt.Sprintf(
				"the active ruleset entry (revision %d) is corrupt: to replace it, send If-Match: r%d", ce.Revision, ce.Revision))
			return errAnswered
		case pre.set && !isCorrupt && (pre.rev != 0 || pre.version != curVersion):
			w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(curVersion, 10)))
			apierror.Write(w, http.StatusPreconditionFailed, apierror.VersionMismatch,
				fmt.Sprintf("the rules are at version %d, not %s: another change came first", curVersion, r.Header.Get("If-Match")))
			return errAnswered
		}
		e = &tollgatev1.RulesEntry{Version: curVersion + 1, Source: src, Format: format, Actor: actor(r), Reason: reason, Time: time.Now().UTC()}
		if n, err := fleetkv.EncodedSize(e); err != nil || n > kv.MaxValue() {
			apierror.Write(w, http.StatusRequestEntityTooLarge, apierror.RulesTooLarge,
				fmt.Sprintf("the ruleset takes %d bytes as a NATS value, more than the %d NATS accepts", n, kv.MaxValue()))
			return errAnswered
		}
		return a.apply(r, &tollgatev1.AuditEntry{Kind: kind, Subject: "rules", Reason: reason, Version: e.Version,
			Before: before, After: rulesState(e.Version, src)}, func(ctx context.Context) error {
			_, err := kv.PutRules(ctx, e, rev)
			return err
		})
	}) {
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatInt(e.Version, 10)))
	writeJSON(w, http.StatusOK, rulesAnswer(rs, map[string]any{"version": e.Version}))
}

func (a *api) rulesVersions(w http.ResponseWriter, r *http.Request) {
	kv := a.kv(w)
	if kv == nil {
		return
	}
	hist, err := kv.RulesVersions(r.Context())
	if err != nil {
		natsFailed(w, err)
		return
	}
	out := make([]map[string]any, 0, len(hist))
	for _, h := range hist {
		if h.Corrupt != nil {
			out = append(out, map[string]any{"revision": h.Revision, "corrupt": true, "bytes": h.Corrupt.Bytes,
				"sha256": h.Corrupt.SHA256, "cause": h.Corrupt.Err.Error()})
			continue
		}
		e := h.Entry
		v := map[string]any{"version": e.Version, "revision": h.Revision, "time": e.Time, "actor": e.Actor, "reason": e.Reason}
		if rs, err := rules.Load([]byte(e.Source)); err == nil {
			v["hash"], v["rules"] = rs.Hash(), len(rs.Rules())
		}
		out = append(out, v)
	}
	writeJSON(w, http.StatusOK, map[string]any{"versions": out, "kept": fleetkv.RulesHistory})
}

func (a *api) rollback(w http.ResponseWriter, r *http.Request) {
	kv := a.kv(w)
	if kv == nil {
		return
	}
	req, ok := readRequest(w, r, parseRollbackBody)
	if !ok {
		return
	}
	hist, err := kv.RulesVersions(r.Context())
	if err != nil {
		natsFailed(w, err)
		return
	}
	var found *tollgatev1.RulesEntry
	for _, h := range hist {
		if h.Entry != nil && h.Entry.Version == req.Version {
			found = h.Entry
		}
	}
	if found == nil {
		apierror.Write(w, http.StatusNotFound, apierror.NotFound, fmt.Sprintf("version %d is not in the kept history (GET /admin/v1/rules/versions)", req.Version))
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
	a.writeRules(w, r, kv, found.Source, found.Format, rs, audit.KindRollback, reason)
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
