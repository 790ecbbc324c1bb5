// Package rulefile loads the gateway's static rules file and watches it:
// the file is polled (its size, modification time and, when either changed
// or every few seconds anyway, its content hash), and a new content is
// parsed, validated and handed over as a whole. An invalid file is refused
// with every problem named by rule, field and line (rules errors never
// quote an API key) and the running ruleset stays; the same bad content is
// reported once, not at every poll.
//
// A file rewritten in place (cp, an editor without atomic saves) is first
// truncated, then written: a poll may read it empty or half-written. An
// invalid content is therefore reported only once it has stayed the same
// for a few polls (settlePolls); a write that completes in the meantime is
// applied without a false error.
//
// Polling rather than inotify: it sees edits in place, renames, symlink
// swaps (Kubernetes ConfigMaps) and network file systems alike, at the cost
// of one stat per interval.
package rulefile

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"time"

	"github.com/tollgate/tollgate/guard/rules"
)

// Ruleset is a loaded rules file.
type Ruleset struct {
	Rules *rules.Ruleset
	// Routes are the file's route templates, in order.
	Routes []string
}

// Version renders the ruleset's version for humans and logs: the file's
// `version`, "+", and the first 12 hex digits of its content hash.
func (r *Ruleset) Version() string { return VersionString(r.Rules) }

// VersionString renders a ruleset's version like Ruleset.Version.
func VersionString(rs *rules.Ruleset) string {
	h := rs.Hash()
	if len(h) > 12 {
		h = h[:12]
	}
	return fmt.Sprintf("%d+%s", rs.Version(), h)
}

// Load reads, parses and compiles the rules file at path.
func Load(path string) (*Ruleset, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return Parse(data)
}

// Parse parses and compiles a rules document (YAML or JSON) with its route
// templates.
func Parse(data []byte) (*Ruleset, error) {
	doc, err := rules.Parse(data)
	if err != nil {
		return nil, err
	}
	return compile(doc)
}

// ParseVersion is Parse for a ruleset whose version is assigned outside
// the document (the operator API's): the document's own `version`
// is ignored and Version reports version. The content hash is still the
// document's.
func ParseVersion(data []byte, version int64) (*Ruleset, error) {
	doc, err := rules.Parse(data)
	if err != nil {
		return nil, err
	}
	doc.Version = version
	return compile(doc)
}

// FromDocument is ParseVersion for a ruleset that arrives both as its
// source and as its parsed document in rules.EncodeDocument's form (the
// operator API publishes both): it decodes doc, which costs a fraction of
// parsing the source's YAML, and compiles it. Its errors name no line:
// to report a refused ruleset, ParseVersion the source.
func FromDocument(doc, source []byte, version int64) (*Ruleset, error) {
	d, err := rules.DecodeDocument(doc, source)
	if err != nil {
		return nil, err
	}
	d.Version = version
	return compile(d)
}

func compile(doc *rules.Document) (*Ruleset, error) {
	rs, err := rules.Compile(doc)
	if err != nil {
		return nil, err
	}
	return &Ruleset{Rules: rs, Routes: append([]string(nil), doc.Routes...)}, nil
}

// Watcher polls a rules file and applies its changes.
type Watcher struct {
	path     string
	interval time.Duration
	apply    func(*Ruleset)
	refuse   func(error)
	check    func(*rules.Ruleset) error
	log      *slog.Logger

	// State owned by Run's goroutine.
	size    int64
	mtime   time.Time
	seen    string // content hash of the last content read
	applied string // content hash of the rules in force
	failing string // the problem last reported, to report a lasting one once
	polls   int
	pending string // content hash of an invalid content not reported yet
	since   int    // polls when pending was first read
}

// settlePolls is how many polls an invalid content must stay unchanged
// before it is reported: a file being rewritten in place settles within
// one interval.
const settlePolls = 2

// Option configures a Watcher.
type Option func(*Watcher)

// WithInterval sets the polling interval (default 250 ms).
func WithInterval(d time.Duration) Option { return func(w *Watcher) { w.interval = d } }

// WithLogger sets the logger (default: discard).
func WithLogger(l *slog.Logger) Option { return func(w *Watcher) { w.log = l } }

// OnRefused sets a function called for each refused change (an invalid or
// unreadable file), once per distinct problem (default: none).
func OnRefused(f func(error)) Option { return func(w *Watcher) { w.refuse = f } }

// WithCheck sets a check a compiled ruleset must pass besides validation,
// such as the guard's bound on rules per request (guard.Guard.CheckRules);
// a ruleset it refuses is refused like an invalid file (default: none).
func WithCheck(f func(*rules.Ruleset) error) Option { return func(w *Watcher) { w.check = f } }

// hashEvery is how many polls may pass without reading the content when
// neither size nor modification time changed (an edit within the file
// system's timestamp granularity keeping the size).
const hashEvery = 8

// NewWatcher returns a Watcher of path whose current content is cur (as
// returned by Load), calling apply with every new valid content. apply is
// called from Run's goroutine.
func NewWatcher(path string, cur *Ruleset, apply func(*Ruleset), opts ...Option) *Watcher {
	w := &Watcher{path: path, interval: 250 * time.Millisecond, apply: apply, refuse: func(error) {}}
	for _, o := range opts {
		o(w)
	}
	if w.log == nil {
		w.log = slog.New(slog.DiscardHandler)
	}
	if cur != nil {
		w.seen, w.applied = cur.Rules.Hash(), cur.Rules.Hash()
	}
	if fi, err := os.Stat(path); err == nil {
		w.size, w.mtime = fi.Size(), fi.ModTime()
	}
	return w
}

// Run polls until ctx is done; it returns nil then.
func (w *Watcher) Run(ctx context.Context) error {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.poll()
		}
	}
}

func (w *Watcher) poll() {
	w.polls++
	fi, err := os.Stat(w.path)
	if err != nil {
		w.fail(fmt.Errorf("rules file %s: %w", w.path, unwrapPath(err)))
		return
	}
	changed := fi.Size() != w.size || !fi.ModTime().Equal(w.mtime)
	if !changed && w.failing == "" && w.pending == "" && w.polls%hashEvery != 0 {
		return
	}
	data, err := os.ReadFile(w.path)
	if err != nil {
		w.fail(fmt.Errorf("rules file %s: %w", w.path, unwrapPath(err)))
		return
	}
	w.size, w.mtime = fi.Size(), fi.ModTime()
	sum := sha256.Sum256(data)
	hash := hex.EncodeToString(sum[:])
	if hash == w.seen && hash != w.pending {
		return
	}
	w.seen = hash
	if hash == w.applied {
		w.pending = ""
		if w.failing != "" {
			w.log.Info("rules file back to the rules in force", slog.String("path", w.path))
			w.failing = ""
		}
		return
	}
	rs, err := Parse(data)
	if err == nil && w.check != nil {
		err = w.check(rs.Rules)
	}
	if err != nil {
		// Perhaps a rewrite in place, read half done: report it only once
		// it has settled.
		if hash != w.pending {
			w.pending, w.since = hash, w.polls
			return
		}
		if w.polls-w.since < settlePolls {
			return
		}
		w.pending = ""
		w.failing = "invalid"
		w.log.Error("rules file refused; the running rules stay", append([]any{
			slog.String("path", w.path), slog.String("hash", hash[:12])}, Problems(err)...)...)
		w.refuse(err)
		return
	}
	w.failing, w.pending = "", ""
	w.applied = hash
	w.apply(rs)
}

// fail reports a problem reading the file, once while it lasts.
func (w *Watcher) fail(err error) {
	if msg := err.Error(); msg != w.failing {
		w.failing = msg
		w.seen = "" // look at whatever comes back
		w.log.Error("rules file unreadable; the running rules stay", slog.String("error", msg))
		w.refuse(err)
	}
}

// Problems turns a rules error into log attributes: one per problem
// (problem_1, problem_2, ...), each naming the rule, field and line.
func Problems(err error) []any {
	var errs []error
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	} else {
		errs = []error{err}
	}
	attrs := make([]any, 0, len(errs))
	for i, e := range errs {
		var ve *rules.ValidationError
		if errors.As(e, &ve) {
			attrs = append(attrs, slog.Group(fmt.Sprintf("problem_%d", i+1),
				slog.String("rule", ve.Rule), slog.String("field", ve.Field),
				slog.Int("line", ve.Line), slog.String("msg", ve.Msg)))
			continue
		}
		attrs = append(attrs, slog.String(fmt.Sprintf("problem_%d", i+1), e.Error()))
	}
	return attrs
}

// unwrapPath drops the *fs.PathError wrapper, whose path the caller names.
func unwrapPath(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
