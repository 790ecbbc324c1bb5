package aggregator

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/aggregator/internal/adminapi"
	"github.com/tollgate/tollgate/aggregator/internal/audit"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/internal/httprec"
)

// Global operator changes (docs/regions.md, "Global operator changes").
//
// A change made with ?scope=global is applied in this region as any
// change is (validated, audited, written to this region's NATS KV), and
// then appended, as the request that made it, to this region's journal:
// a JetStream stream in this region's own domain. Every other region's
// aggregators read that stream across the link (by sequence, in this
// region's domain, from the one after the last they applied) and replay
// each change through their own operator API, in process: the same
// validation, the same audit entry (naming the origin region), the same
// KV write their gateways watch. Conflicts between regions are settled
// by the last writer: a change applies only when its (time, origin) is
// later than the last global change applied to the same entry, which also
// makes a change delivered twice apply once.

const (
	// globalBucket holds, in each region's own domain, the last global
	// change applied per entry and the last journal sequence applied per
	// origin region.
	globalBucket = "tollgate_global"
	// globalRetention is how long a journal keeps changes: a region cut
	// off for longer misses the older ones.
	globalRetention = 30 * 24 * time.Hour
	// globalPoll is how often the regions list is read again, and the
	// pause before reading a journal again after a failure.
	globalPoll = time.Second
	// journalPoll is how often a journal read up to its end is read again.
	journalPoll = 200 * time.Millisecond
	// journalGetTimeout bounds each read of another region's journal.
	journalGetTimeout = 5 * time.Second
)

// globalStream is region's journal of global changes, in region's domain.
func globalStream(region string) string { return "tollgate_global_" + region }

// globalSubject is the subject of region's journal.
func globalSubject(region string) string { return "tollgate.global." + region }

// globalChange is one journal message: the request that made a change.
type globalChange struct {
	ID          string `json:"id"`
	Origin      string `json:"origin"`
	TimeMicros  int64  `json:"time_us"`
	Method      string `json:"method"`
	Path        string `json:"path"` // {key} as kid:<key_id>: no API key leaves the region
	Query       string `json:"query,omitempty"`
	ContentType string `json:"content_type,omitempty"`
	Body        []byte `json:"body,omitempty"`
	Actor       string `json:"actor,omitempty"`
}

// lastWrite is the last global change applied to an entry.
type lastWrite struct {
	TimeMicros int64  `json:"time_us"`
	Origin     string `json:"origin"`
	ID         string `json:"id"`
}

// later reports whether c was made after w, by (time, origin region).
func (c *globalChange) later(w *lastWrite) bool {
	if w == nil {
		return true
	}
	if c.TimeMicros != w.TimeMicros {
		return c.TimeMicros > w.TimeMicros
	}
	return c.Origin > w.Origin
}

// globalLink is what global changes need of this region's NATS.
type globalLink struct {
	nc *fleetkv.Conn
	js jetstream.JetStream
	kv jetstream.KeyValue
}

// entryKey is the global bucket's key of the entry a change's path names.
func entryKey(path string) string {
	sum := sha256.Sum256([]byte(strings.TrimPrefix(path, "/admin/v1/")))
	return "w." + hex.EncodeToString(sum[:16])
}

func (l *globalLink) lastWrite(ctx context.Context, path string) (*lastWrite, error) {
	e, err := l.kv.Get(ctx, entryKey(path))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("aggregator: read last global write: %w", err)
	}
	var w lastWrite
	if err := json.Unmarshal(e.Value(), &w); err != nil {
		return nil, nil // unreadable: any change replaces it
	}
	return &w, nil
}

func (l *globalLink) recordWrite(ctx context.Context, c *globalChange) error {
	b, _ := json.Marshal(lastWrite{TimeMicros: c.TimeMicros, Origin: c.Origin, ID: c.ID})
	if _, err := l.kv.Put(ctx, entryKey(c.Path), b); err != nil {
		return fmt.Errorf("aggregator: record global write: %w", err)
	}
	return nil
}

func (l *globalLink) applied(ctx context.Context, origin string) (uint64, error) {
	e, err := l.kv.Get(ctx, "applied."+origin)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("aggregator: read applied sequence: %w", err)
	}
	return strconv.ParseUint(string(e.Value()), 10, 64)
}

func (l *globalLink) setApplied(ctx context.Context, origin string, seq uint64) error {
	if _, err := l.kv.Put(ctx, "applied."+origin, []byte(strconv.FormatUint(seq, 10))); err != nil {
		return fmt.Errorf("aggregator: record applied sequence: %w", err)
	}
	return nil
}

// openGlobal creates this region's journal and global bucket.
func (s *Server) openGlobal(ctx context.Context, nc *fleetkv.Conn) (*globalLink, error) {
	js := nc.JetStream()
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: globalStream(s.cfg.Region),
		Subjects: []string{globalSubject(s.cfg.Region)}, MaxAge: globalRetention, Duplicates: 10 * time.Minute,
		Storage: jetstream.FileStorage}); err != nil {
		return nil, fmt.Errorf("aggregator: global changes stream: %w", err)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: globalBucket, History: 1, Storage: jetstream.FileStorage})
	if err != nil {
		return nil, fmt.Errorf("aggregator: global changes bucket: %w", err)
	}
	return &globalLink{nc: nc, js: js, kv: kv}, nil
}

// globalPath checks that a change may be made global and returns its path
// with {key} as kid:<key_id>.
func (s *Server) globalPath(method, path string) (string, bool) {
	rest, ok := strings.CutPrefix(path, "/admin/v1/")
	if !ok {
		return "", false
	}
	if rest == "rules" {
		return path, method == http.MethodPut
	}
	kind, key, ok := strings.Cut(rest, "/")
	if !ok || key == "" || strings.Contains(key, "/") {
		return "", false
	}
	switch {
	case (kind == "blocklist" || kind == "allowlist" || kind == "overrides") && (method == http.MethodPut || method == http.MethodDelete):
	case kind == "penalties" && method == http.MethodDelete:
	default:
		return "", false
	}
	if strings.HasPrefix(key, "kid:") || (kind == "overrides" && strings.HasPrefix(key, "tenant:")) {
		return path, true
	}
	return "/admin/v1/" + kind + "/kid:" + s.hasher.ID(key), true
}

// globalScope serves ?scope=global (and scope=regional, the default) on
// the operator API's changes.
func (s *Server) globalScope(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if !q.Has("scope") {
			next.ServeHTTP(w, r)
			return
		}
		scope := q["scope"]
		if len(scope) != 1 || (scope[0] != "global" && scope[0] != "regional") {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "scope: global (every region) or regional (this region, the default)")
			return
		}
		q.Del("scope")
		r.URL.RawQuery = q.Encode()
		if scope[0] == "regional" {
			next.ServeHTTP(w, r)
			return
		}
		path, ok := s.globalPath(r.Method, r.URL.Path)
		if !ok {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest,
				"scope=global: only PUT rules, PUT and DELETE blocklist, allowlist and overrides, and DELETE penalties can be made global")
			return
		}
		link := s.global.Load()
		if link == nil || !link.nc.IsConnected() {
			apierror.Write(w, http.StatusServiceUnavailable, apierror.NATSUnavailable, "a global change needs NATS, not reached now: nothing was changed")
			return
		}
		limit := int64(link.nc.MaxPayload() - 8<<10)
		body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
		if err != nil {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "reading the body failed")
			return
		}
		if int64(len(body)) > limit {
			apierror.Write(w, http.StatusRequestEntityTooLarge, apierror.BodyTooLarge,
				fmt.Sprintf("a global change's body must fit one NATS message: at most %d bytes; nothing was changed", limit))
			return
		}
		now := time.Now()
		c := &globalChange{ID: audit.NewID(now), Origin: s.cfg.Region, TimeMicros: now.UnixMicro(), Method: r.Method, Path: path,
			Query: q.Encode(), ContentType: r.Header.Get("Content-Type"), Body: body, Actor: r.Header.Get("X-Tollgate-Actor")}
		r.Body = io.NopCloser(bytes.NewReader(body))
		rec := &httprec.Recorder{H: w.Header()}
		next.ServeHTTP(rec, r.WithContext(adminapi.WithOrigin(r.Context(), s.cfg.Region)))
		if rec.Status < 200 || rec.Status > 299 {
			rec.Flush(w)
			return
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
		defer cancel()
		if err := s.publishGlobal(ctx, link, c); err != nil {
			s.log.Error("a global change is in force in this region only: sending it to the others failed",
				slog.String("change", c.ID), slog.String("path", c.Path), slog.String("error", err.Error()))
			w.Header().Del("Content-Length")
			apierror.Write(w, http.StatusServiceUnavailable, apierror.NATSUnavailable,
				"the change is in force in this region but was not sent to the other regions ("+err.Error()+"): repeat the request")
			return
		}
		rec.Flush(w)
	})
}

// publishGlobal records c as the entry's last write here and appends it
// to this region's journal.
func (s *Server) publishGlobal(ctx context.Context, link *globalLink, c *globalChange) error {
	if err := link.recordWrite(ctx, c); err != nil {
		return err
	}
	b, err := json.Marshal(c)
	if err != nil {
		return fmt.Errorf("aggregator: encode global change: %w", err)
	}
	m := nats.NewMsg(globalSubject(s.cfg.Region))
	m.Data = b
	m.Header.Set(jetstream.MsgIDHeader, c.ID)
	if _, err := link.js.PublishMsg(ctx, m); err != nil {
		return fmt.Errorf("aggregator: append to the global changes stream: %w", err)
	}
	return nil
}

// runGlobal creates this region's journal, then reads every other
// region's journal (the rules' regions list, read again every second)
// until ctx is done.
func (s *Server) runGlobal(ctx context.Context, nc *fleetkv.Conn, replay http.Handler) {
	log := s.log.With(slog.String("component", "global"))
	var link *globalLink
	for link == nil {
		octx, cancel := context.WithTimeout(ctx, 5*time.Second)
		l, err := s.openGlobal(octx, nc)
		cancel()
		if err == nil {
			link = l
			break
		}
		log.Warn("global changes unavailable until JetStream answers", slog.String("error", err.Error()))
		select {
		case <-ctx.Done():
			return
		case <-time.After(globalPoll):
		}
	}
	s.global.Store(link)
	defer s.global.Store(nil)
	var wg sync.WaitGroup
	defer wg.Wait()
	reading := map[string]bool{}
	for {
		if names, err := s.regionNames(ctx); err == nil {
			for _, n := range names {
				if n != s.cfg.Region && !reading[n] && rules.CheckRegionName(n) == nil {
					reading[n] = true
					wg.Go(func() { s.readJournal(ctx, link, n, replay, log.With(slog.String("origin", n))) })
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(globalPoll):
		}
	}
}

// readJournal applies origin's journal, from the sequence after the last
// one applied, until ctx is done: read again journalPoll after it caught
// up, globalPoll after a read failed (the link is cut).
func (s *Server) readJournal(ctx context.Context, link *globalLink, origin string, replay http.Handler, log *slog.Logger) {
	failing := false
	for ctx.Err() == nil {
		err := s.readJournalOnce(ctx, link, origin, replay, log)
		if ctx.Err() != nil {
			return
		}
		if err != nil && !failing {
			log.Warn("reading another region's global changes failed; this region keeps the changes it has and catches up when it can",
				slog.String("error", err.Error()))
		}
		failing = err != nil
		wait := journalPoll // caught up: look for the next change soon
		if err != nil {
			wait = globalPoll
		}
		select {
		case <-ctx.Done():
		case <-time.After(wait):
		}
	}
}

// readJournalOnce applies what origin's journal holds after the last
// sequence applied, one message at a time by sequence (a direct get, each
// bounded by ctx and journalGetTimeout, so that a cut link or a stop never
// waits on a consumer being recreated across it), and returns nil once it
// has caught up.
func (s *Server) readJournalOnce(ctx context.Context, link *globalLink, origin string, replay http.Handler, log *slog.Logger) error {
	rjs, err := link.nc.JetStreamIn(origin)
	if err != nil {
		return err
	}
	last, err := link.applied(ctx, origin)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, journalGetTimeout)
	stream, err := rjs.Stream(cctx, globalStream(origin))
	cancel()
	if err != nil {
		return fmt.Errorf("aggregator: read region %s's global changes: %w", origin, err)
	}
	for ctx.Err() == nil {
		gctx, cancel := context.WithTimeout(ctx, journalGetTimeout)
		m, err := stream.GetMsg(gctx, last+1)
		cancel()
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			// Caught up, unless the journal no longer holds last+1
			// (older than its retention): go on from its first.
			ictx, cancel := context.WithTimeout(ctx, journalGetTimeout)
			info, ierr := stream.Info(ictx)
			cancel()
			if ierr != nil {
				return fmt.Errorf("aggregator: read region %s's global changes: %w", origin, ierr)
			}
			if first := info.State.FirstSeq; info.State.Msgs > 0 && last+1 < first {
				log.Warn("another region's journal no longer holds changes this region has not applied; going on from its oldest",
					slog.Uint64("applied", last), slog.Uint64("first", first))
				last = first - 1
				continue
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("aggregator: read region %s's global changes: %w", origin, err)
		}
		if err := s.applyGlobal(ctx, link, origin, m.Data, replay, log); err != nil {
			return err
		}
		if err := link.setApplied(ctx, origin, m.Sequence); err != nil {
			return err
		}
		last = m.Sequence
	}
	return nil
}

// applyGlobal replays one change of origin's journal through this
// region's operator API, unless a later global change of the same entry
// was applied already. It returns an error (and the change is read again)
// only when this region could not take it now.
func (s *Server) applyGlobal(ctx context.Context, link *globalLink, origin string, data []byte, replay http.Handler, log *slog.Logger) error {
	var c globalChange
	if err := json.Unmarshal(data, &c); err != nil || c.Origin != origin || c.ID == "" {
		log.Warn("skipped a global change that does not decode", slog.Int("bytes", len(data)))
		return nil
	}
	if _, ok := s.globalPath(c.Method, c.Path); !ok || !strings.HasPrefix(c.Path, "/admin/v1/") {
		log.Warn("skipped a global change of a route that cannot be global", slog.String("change", c.ID))
		return nil
	}
	w, err := link.lastWrite(ctx, c.Path)
	if err != nil {
		return err
	}
	if !c.later(w) {
		log.Debug("global change not applied: a later one was", slog.String("change", c.ID))
		return nil
	}
	target := c.Path
	if c.Query != "" {
		target += "?" + c.Query
	}
	req, err := http.NewRequestWithContext(adminapi.WithOrigin(ctx, c.Origin), c.Method, target, bytes.NewReader(c.Body))
	if err != nil {
		log.Warn("skipped a global change whose request does not parse", slog.String("change", c.ID))
		return nil
	}
	if c.ContentType != "" {
		req.Header.Set("Content-Type", c.ContentType)
	}
	if c.Actor != "" {
		req.Header.Set("X-Tollgate-Actor", c.Actor)
	}
	rec := &httprec.Recorder{H: http.Header{}}
	replay.ServeHTTP(rec, req)
	switch {
	case rec.Status >= 500:
		return fmt.Errorf("aggregator: applying global change %s: %d %s", c.ID, rec.Status, bytes.TrimSpace(rec.Body.Bytes()))
	case rec.Status >= 200 && rec.Status <= 299, rec.Status == http.StatusNotFound:
		log.Info("global change applied", slog.String("change", c.ID), slog.String("method", c.Method), slog.String("path", c.Path))
	default:
		log.Warn("this region refused a global change", slog.String("change", c.ID), slog.Int("status", rec.Status),
			slog.String("answer", string(bytes.TrimSpace(rec.Body.Bytes()))))
	}
	return link.recordWrite(ctx, &c)
}
