package adminapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// listBody is the body of PUT blocklist/{key} and allowlist/{key}.
type listBody struct {
	TTL    string        `json:"ttl"`
	Reason string        `json:"reason"`
	ttl    time.Duration // TTL parsed
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

// listKey is the blocklist bucket's KV key and the audit kind of a list
// route's {key}.
func listKey(action, id string) (name, kind string) {
	if action == tollgatev1.ActionAllow {
		return tollgatev1.AllowlistKey(id), audit.KindAllowlist
	}
	return tollgatev1.BlocklistKey(id), audit.KindBlocklist
}

// listTarget is the entry a list route's request names.
type listTarget struct {
	kv         *fleetkv.KV
	id, prefix string // the key's key_id and its prefix for humans
	name, kind string // the entry's KV key and audit kind
}

// listTarget reads the entry a list route's request names; when ok is
// false the request is answered.
func (a *api) listTarget(w http.ResponseWriter, r *http.Request, action string) (t listTarget, ok bool) {
	if t.kv = a.kv(w); t.kv == nil {
		return t, false
	}
	if t.id, t.prefix, ok = a.key(w, r); !ok {
		return t, false
	}
	t.name, t.kind = listKey(action, t.id)
	return t, true
}

// listRace answers a list write that kept losing to other writers.
var listRace = lostRace{retry: true, status: http.StatusConflict, code: apierror.Conflict,
	msg: "the entry kept changing meanwhile: try again"}

// corruptList answers a corrupt blocklist bucket entry.
func corruptList(w http.ResponseWriter, kind string, ce *fleetkv.CorruptError) {
	corruptAnswer(w, apierror.EntryCorrupt, strconv.FormatUint(ce.Revision, 10), ce, fmt.Sprintf(
		"Replace it with PUT or remove it with DELETE on this route. Meanwhile gateways %s.", corruptListEffect(kind)))
}

// corruptListEffect says what gateways do with a corrupt entry of kind.
func corruptListEffect(kind string) string {
	if kind == audit.KindAllowlist {
		return "do not allowlist the key"
	}
	return "block the key (403)"
}

// listRoute is the handler of a list route: it reads the entry the request
// names, then do serves the request.
func (a *api) listRoute(action string, do func(w http.ResponseWriter, r *http.Request, action string, t listTarget)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		t, ok := a.listTarget(w, r, action)
		if !ok {
			return
		}
		do(w, r, action, t)
	}
}

func (a *api) getList(w http.ResponseWriter, r *http.Request, action string, t listTarget) {
	kv, name, kind := t.kv, t.name, t.kind
	cur, rev, err := kv.List(r.Context(), name)
	var ce *fleetkv.CorruptError
	switch {
	case errors.As(err, &ce):
		corruptList(w, kind, ce)
	case err != nil:
		natsFailed(w, err)
	case cur == nil:
		apierror.Write(w, http.StatusNotFound, apierror.NotFound, "the key is not on the "+kind)
	default:
		w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(rev, 10)))
		writeJSON(w, http.StatusOK, cur)
	}
}

func (a *api) putList(w http.ResponseWriter, r *http.Request, action string, t listTarget) {
	kv, id, prefix, name, kind := t.kv, t.id, t.prefix, t.name, t.kind
	req, ok := readRequest(w, r, parseListBody)
	if !ok {
		return
	}
	unlock, ok := a.lockWrites(w, r)
	if !ok {
		return
	}
	defer unlock()
	var e *tollgatev1.ListEntry
	if !retryWrite(w, listRace, func() error {
		cur, rev, err := kv.List(r.Context(), name)
		before, err := replacedState(w, cur, err)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		e = &tollgatev1.ListEntry{KeyID: id, KeyPrefix: prefix, Action: action, Reason: req.Reason, Actor: actor(r), CreatedAt: now}
		if req.ttl > 0 {
			e.ExpiresAt = now.Add(req.ttl)
		}
		return a.apply(r, &tollgatev1.AuditEntry{Kind: kind, Subject: id, KeyPrefix: prefix, Reason: req.Reason,
			Before: before, After: mustJSON(e)}, func(ctx context.Context) error {
			_, err := kv.PutList(ctx, name, e, rev)
			return err
		})
	}) {
		return
	}
	if action == tollgatev1.ActionAllow {
		a.liftAllowlisted(r.Context(), id, actor(r))
	}
	writeJSON(w, http.StatusOK, e)
}

func (a *api) deleteList(w http.ResponseWriter, r *http.Request, action string, t listTarget) {
	kv, id, prefix, name, kind := t.kv, t.id, t.prefix, t.name, t.kind
	unlock, ok := a.lockWrites(w, r)
	if !ok {
		return
	}
	defer unlock()
	if !retryWrite(w, listRace, func() error {
		cur, rev, err := kv.List(r.Context(), name)
		present := cur != nil && (action == tollgatev1.ActionAllow || cur.Action == action)
		before, err := removedState(w, cur, present, err, "the key is not on the "+kind)
		if err != nil {
			return err
		}
		return a.apply(r, &tollgatev1.AuditEntry{Kind: kind, Subject: id, KeyPrefix: prefix, Reason: r.URL.Query().Get("reason"),
			Before: before, After: []byte("null")}, func(ctx context.Context) error {
			return fleetkv.Delete(ctx, kv.Lists, name, rev)
		})
	}) {
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// overrideRace answers an override write that lost to another writer:
// retried when the request named no version.
func overrideRace(pre precondition) lostRace {
	return lostRace{retry: !pre.set, status: http.StatusPreconditionFailed, code: apierror.VersionMismatch,
		msg: "the override changed meanwhile: read it again"}
}

// overrideBody is the body of PUT overrides/{key}.
type overrideBody struct {
	Limit  *int64        `json:"limit"`
	Factor *float64      `json:"factor"`
	Rule   string        `json:"rule"`
	TTL    string        `json:"ttl"`
	Reason string        `json:"reason"`
	ttl    time.Duration // TTL parsed
}

// overrideSubject parses {key} of overrides: tenant:<name>, or a key.
func (a *api) overrideSubject(w http.ResponseWriter, r *http.Request) (scope, subject, prefix string, ok bool) {
	if t, isTenant := strings.CutPrefix(r.PathValue("key"), "tenant:"); isTenant {
		if err := rules.CheckName(t); err != nil {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "tenant: "+err.Error())
			return "", "", "", false
		}
		return tollgatev1.ScopeTenant, t, "", true
	}
	id, prefix, ok := a.key(w, r)
	return tollgatev1.ScopeKey, id, prefix, ok
}

// overrideTarget is the entry an override route's request names.
type overrideTarget struct {
	kv                     *fleetkv.KV
	scope, subject, prefix string // see overrideSubject
	name                   string // the entry's KV key
}

// overrideTarget reads the entry an override route's request names; when
// ok is false the request is answered.
func (a *api) overrideTarget(w http.ResponseWriter, r *http.Request) (t overrideTarget, ok bool) {
	if t.kv = a.kv(w); t.kv == nil {
		return t, false
	}
	if t.scope, t.subject, t.prefix, ok = a.overrideSubject(w, r); !ok {
		return t, false
	}
	t.name = tollgatev1.OverrideKey(t.scope, t.subject)
	return t, true
}

// corruptOverride answers a corrupt overrides bucket entry.
func corruptOverride(w http.ResponseWriter, ce *fleetkv.CorruptError) {
	corruptAnswer(w, apierror.EntryCorrupt, strconv.FormatUint(ce.Revision, 10), ce, fmt.Sprintf(
		"Replace it with PUT (If-Match: %d) or remove it with DELETE on this route. Meanwhile gateways ignore it: the rules' own limits apply.",
		ce.Revision))
}

// overrideRoute is the handler of an override route: it reads the entry
// the request names, then do serves the request.
func (a *api) overrideRoute(do func(w http.ResponseWriter, r *http.Request, t overrideTarget)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		t, ok := a.overrideTarget(w, r)
		if !ok {
			return
		}
		do(w, r, t)
	}
}

func (a *api) getOverride(w http.ResponseWriter, r *http.Request, t overrideTarget) {
	cur, rev, err := t.kv.Override(r.Context(), t.name)
	var ce *fleetkv.CorruptError
	switch {
	case errors.As(err, &ce):
		corruptOverride(w, ce)
	case err != nil:
		natsFailed(w, err)
	case cur == nil:
		apierror.Write(w, http.StatusNotFound, apierror.NotFound, "no override")
	default:
		w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(rev, 10)))
		writeJSON(w, http.StatusOK, map[string]any{"version": rev, "override": cur})
	}
}

func (a *api) putOverride(w http.ResponseWriter, r *http.Request, t overrideTarget) {
	kv, subject, prefix, name := t.kv, t.subject, t.prefix, t.name
	req, ok := readRequest(w, r, parseOverrideBody)
	if !ok {
		return
	}
	pre, unlock, ok := a.beginConditional(w, r)
	if !ok {
		return
	}
	defer unlock()
	var e *tollgatev1.OverrideEntry
	var nrev uint64
	if !retryWrite(w, overrideRace(pre), func() error {
		cur, rev, err := kv.Override(r.Context(), name)
		before, err := replacedState(w, cur, err)
		if err != nil {
			return err
		}
		if pre.set && pre.revision() != rev {
			w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(rev, 10)))
			apierror.Write(w, http.StatusPreconditionFailed, apierror.VersionMismatch, fmt.Sprintf("the override is at version %d, not %s", rev, r.Header.Get("If-Match")))
			return errAnswered
		}
		now := time.Now().UTC()
		e = &tollgatev1.OverrideEntry{Scope: t.scope, Subject: subject, KeyPrefix: prefix, Rule: req.Rule, Reason: req.Reason,
			Actor: actor(r), CreatedAt: now}
		if req.Limit != nil {
			e.Limit = *req.Limit
		} else {
			e.Factor = *req.Factor
		}
		if req.ttl > 0 {
			e.ExpiresAt = now.Add(req.ttl)
		}
		audited := &tollgatev1.AuditEntry{Kind: audit.KindOverride, Subject: subject, KeyPrefix: prefix, Reason: req.Reason,
			Before: before, After: mustJSON(e)}
		return a.apply(r, audited, func(ctx context.Context) error {
			var err error
			nrev, err = kv.PutOverride(ctx, name, e, rev)
			return err
		})
	}) {
		return
	}
	w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(nrev, 10)))
	writeJSON(w, http.StatusOK, map[string]any{"version": nrev, "override": e})
}

func (a *api) deleteOverride(w http.ResponseWriter, r *http.Request, t overrideTarget) {
	kv, subject, prefix, name := t.kv, t.subject, t.prefix, t.name
	pre, unlock, ok := a.beginConditional(w, r)
	if !ok {
		return
	}
	defer unlock()
	if !retryWrite(w, overrideRace(pre), func() error {
		cur, rev, err := kv.Override(r.Context(), name)
		before, err := removedState(w, cur, cur != nil, err, "no override")
		if err != nil {
			return err
		}
		if pre.set && pre.revision() != rev {
			w.Header().Set("ETag", strconv.Quote(strconv.FormatUint(rev, 10)))
			apierror.Write(w, http.StatusPreconditionFailed, apierror.VersionMismatch, fmt.Sprintf("the override is at version %d", rev))
			return errAnswered
		}
		return a.apply(r, &tollgatev1.AuditEntry{Kind: audit.KindOverride, Subject: subject, KeyPrefix: prefix,
			Reason: r.URL.Query().Get("reason"), Before: before, After: []byte("null")}, func(ctx context.Context) error {
			return fleetkv.Delete(ctx, kv.Overrides, name, rev)
		})
	}) {
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
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidKey,
			"{key}: an API key (at most 256 bytes, no spaces or control characters: what a gateway accepts) or kid:<key_id>")
		return "", "", false
	}
	if !strings.HasPrefix(k, "kid:") {
		prefix = keyid.Prefix(k)
	}
	return id, prefix, true
}

// subject turns a {key} (an API key or kid:<key_id>) into its key_id; ok
// is false for a malformed one, or for an API key no gateway would accept
// (guard.ValidKey: control characters, spaces, over 256 bytes): no
// request can carry it, so an entry for it would only mislead.
func subject(h *keyid.Hasher, key string) (string, bool) {
	if id, ok := strings.CutPrefix(key, "kid:"); ok {
		return id, keyid.Valid(id)
	}
	if key == "" || !guard.ValidKey(key) {
		return "", false
	}
	return h.ID(key), true
}

func parseListBody(b []byte) (listBody, error) {
	var req listBody
	if len(strings.TrimSpace(string(b))) > 0 {
		if err := strictJSON(b, &req); err != nil {
			return req, fmt.Errorf(`body: {"ttl": "10m", "reason": "…"} (both optional): %w`, err)
		}
	}
	if len(req.Reason) > maxReason {
		return req, fmt.Errorf("reason: at most %d bytes", maxReason)
	}
	var err error
	req.ttl, err = parseTTL(req.TTL)
	return req, err
}

func parseOverrideBody(b []byte) (overrideBody, error) {
	var req overrideBody
	if err := strictJSON(b, &req); err != nil {
		return req, fmt.Errorf(`body: {"limit": N} or {"factor": F}, with "ttl", "reason" and "rule" optional: %w`, err)
	}
	if (req.Limit == nil) == (req.Factor == nil) || (req.Limit != nil && (*req.Limit < 1 || *req.Limit > 1<<40)) ||
		(req.Factor != nil && !(*req.Factor > 0 && *req.Factor <= 1e6)) {
		return req, errors.New("exactly one of limit (an integer from 1 to 2^40) and factor (a number in (0, 1e6])")
	}
	if len(req.Reason) > maxReason || len(req.Rule) > 256 {
		return req, fmt.Errorf("reason: at most %d bytes; rule: at most 256", maxReason)
	}
	var err error
	req.ttl, err = parseTTL(req.TTL)
	return req, err
}
