package rulefile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tollgate/tollgate/guard/rules"
	"github.com/tollgate/tollgate/internal/testnet"
	"github.com/tollgate/tollgate/internal/testwait"
)

const valid = `
version: 4
routes: ["/v1/users/{id}", "/v1/orders/{id}"]
rules:
  - {id: r, match: {}, algorithm: token_bucket, capacity: %d, rate: 1/1s}
`

func write(t *testing.T, path, body string) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func rulesWith(capacity string) string { return strings.Replace(valid, "%d", capacity, 1) }

func TestLoad(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "rules.yaml")
	write(t, path, rulesWith("5"))
	rs, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs.Routes) != 2 || rs.Routes[1] != "/v1/orders/{id}" || rs.Rules.Version() != 4 {
		t.Fatalf("%+v", rs)
	}
	if v := rs.Version(); !strings.HasPrefix(v, "4+") || len(v) != 2+12 {
		t.Fatalf("Version %q", v)
	}
	write(t, path, rulesWith("0"))
	var ve *rules.ValidationError
	if _, err := Load(path); !errors.As(err, &ve) || ve.Rule != "r" {
		t.Fatalf("invalid file: %v", err)
	}
	if _, err := Load(path + ".none"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("missing file: %v", err)
	}
}

// recorder collects what a Watcher hands over.
type recorder struct {
	mu      sync.Mutex
	applied []*Ruleset
	refused []error
}

func (r *recorder) counts() (int, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.applied), len(r.refused)
}

// watch writes a rules file (limit 5) and returns a Watcher of it, with
// opts, that hands over to rec.
func watch(t *testing.T, opts ...Option) (path string, w *Watcher, rec *recorder) {
	t.Helper()
	path = filepath.Join(t.TempDir(), "rules.yaml")
	write(t, path, rulesWith("5"))
	cur, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	rec = &recorder{}
	apply := func(rs *Ruleset) {
		rec.mu.Lock()
		rec.applied = append(rec.applied, rs)
		rec.mu.Unlock()
	}
	refuse := OnRefused(func(err error) {
		rec.mu.Lock()
		rec.refused = append(rec.refused, err)
		rec.mu.Unlock()
	})
	return path, NewWatcher(path, cur, apply, append([]Option{refuse}, opts...)...), rec
}

func TestWatcher(t *testing.T) {
	t.Parallel()
	path, w, rec := watch(t, WithInterval(5*time.Millisecond))
	run := testnet.Start(t, "watcher", w.Run)
	defer run.StopNow(t)

	expect := func(applied, refused int) {
		t.Helper()
		testwait.Eventually(t, 2*time.Second, func() error {
			if a, r := rec.counts(); a != applied || r != refused {
				return fmt.Errorf("applied %d, refused %d", a, r)
			}
			return nil
		})
	}
	write(t, path, rulesWith("6"))
	expect(1, 0)
	write(t, path, rulesWith("0")) // invalid: refused once, however many polls
	expect(1, 1)
	write(t, path, rulesWith("6"))  // back to the rules in force: nothing to apply
	write(t, path, rulesWith("-1")) // another invalid content: reported
	expect(1, 2)
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	expect(1, 3)
	write(t, path, rulesWith("7"))
	expect(2, 3)
	rec.mu.Lock()
	last := rec.applied[len(rec.applied)-1]
	rec.mu.Unlock()
	if p, _ := last.Rules.Rule("r").ParamsFor("", ""); p.Limit != 7 {
		t.Fatalf("applied limit %d, want 7", p.Limit)
	}
}

// TestWatcherRewriteInPlace: a file replaced by cp (truncated, then
// written) may be read empty or half-written; that is not reported when
// the write completes within the settling polls, and a content that stays
// invalid is reported once it has settled. Polls are driven by hand, so no
// timing is involved.
func TestWatcherRewriteInPlace(t *testing.T) {
	t.Parallel()
	path, w, rec := watch(t)
	full := rulesWith("6")
	for _, partial := range []string{"", full[:len(full)/2]} {
		if err := os.WriteFile(path, []byte(partial), 0o600); err != nil { // cp's truncate, then a short write
			t.Fatal(err)
		}
		w.poll()
	}
	if err := os.WriteFile(path, []byte(full), 0o600); err != nil {
		t.Fatal(err)
	}
	w.poll()
	if a, r := rec.counts(); a != 1 || r != 0 {
		t.Fatalf("after a rewrite in place: applied %d, refused %d; want 1, 0", a, r)
	}

	// Invalid and staying so: reported after settling, once. (Another size
	// than the rules in force, so the poll sees it whatever the file
	// system's timestamp granularity.)
	if err := os.WriteFile(path, []byte(rulesWith("-1")), 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range settlePolls + 3 {
		w.poll()
		want := 0
		if i >= settlePolls {
			want = 1
		}
		if _, r := rec.counts(); r != want {
			t.Fatalf("poll %d: refused %d, want %d", i, r, want)
		}
	}
}

// TestWatcherCheck: a ruleset the check refuses is refused like an
// invalid one.
func TestWatcherCheck(t *testing.T) {
	t.Parallel()
	path, w, rec := watch(t, WithCheck(func(rs *rules.Ruleset) error {
		if p, _ := rs.Rule("r").ParamsFor("", ""); p.Limit > 100 {
			return errors.New("too big")
		}
		return nil
	}))
	write(t, path, rulesWith("500"))
	for range settlePolls + 1 {
		w.poll()
	}
	if a, r := rec.counts(); a != 0 || r != 1 {
		t.Fatalf("applied %d, refused %d; want 0, 1", a, r)
	}
	write(t, path, rulesWith("50"))
	w.poll()
	if a, _ := rec.counts(); a != 1 {
		t.Fatalf("applied %d, want 1", a)
	}
}
