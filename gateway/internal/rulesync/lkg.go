package rulesync

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tollgate/tollgate/gateway/internal/rulefile"
	"github.com/tollgate/tollgate/internal/fleetkv"
	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// LKGFile is the last-known-good copy's name in Config.Dir.
const LKGFile = "lkg.json"

// lkgFormat is the version of the copy's layout; a copy of another
// version is not read.
const lkgFormat = 1

// lkg is the last-known-good copy on disk: the buckets' values as the
// Syncer last applied them, by KV key (the ruleset: the last one that
// passed validation).
type lkg struct {
	Format    int                                  `json:"format"`
	SavedAt   time.Time                            `json:"saved_at"`
	Rules     *tollgatev1.RulesEntry               `json:"rules,omitempty"`
	Blocklist map[string]*tollgatev1.ListEntry     `json:"blocklist"`
	Overrides map[string]*tollgatev1.OverrideEntry `json:"overrides"`
	// CorruptBlocklist holds the blocklist bucket's corrupt entries, by KV
	// key: their revision (they block their key_id; see the package's
	// notes). Absent in copies of older gateways.
	CorruptBlocklist map[string]uint64 `json:"corrupt_blocklist,omitempty"`
}

// LKG describes a last-known-good copy read from disk.
type LKG struct {
	// Path is the file read.
	Path string
	// SavedAt is when it was written.
	SavedAt time.Time
	// Rules is its ruleset, nil when it holds none (NATS had none yet, or
	// it no longer passes the gateway's checks).
	Rules *rulefile.Ruleset
	// Entries is the number of blocklist entries (corrupt ones
	// included) and overrides put in force.
	Entries int
}

// LoadLKG reads the last-known-good copy, puts its controls in force
// (Controls.Replace) and returns it, so that a gateway starts from what
// the fleet last told it when NATS is unreachable. With no copy it returns
// nil, nil. A copy that cannot be read or decoded is an error (nothing is
// put in force); a ruleset in it that no longer passes validation or
// Config.Check is dropped with a log line (LKG.Rules nil). Call it before
// Run, from the goroutine that then calls Run.
func (s *Syncer) LoadLKG() (*LKG, error) {
	path := filepath.Join(s.cfg.Dir, LKGFile)
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("rulesync: read last-known-good copy: %w", err)
	}
	var f lkg
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("rulesync: decode last-known-good copy %s: %w", path, err)
	}
	if f.Format != lkgFormat {
		return nil, fmt.Errorf("rulesync: last-known-good copy %s: format %d, want %d", path, f.Format, lkgFormat)
	}
	st := newState()
	for k, e := range f.Blocklist {
		applyCopied(&st, tollgatev1.BucketBlocklist, k, e)
	}
	for k, e := range f.Overrides {
		applyCopied(&st, tollgatev1.BucketOverrides, k, e)
	}
	for k, rev := range f.CorruptBlocklist {
		st.CorruptLists[k] = &fleetkv.CorruptError{Bucket: tollgatev1.BucketBlocklist, Key: k, Revision: rev, Err: errCorruptInCopy}
	}
	out := &LKG{Path: path, SavedAt: f.SavedAt, Entries: len(st.Lists) + len(st.Overrides) + len(st.CorruptLists)}
	if f.Rules != nil {
		rs, err := rulefile.ParseVersion([]byte(f.Rules.Source), f.Rules.Version)
		if err == nil && s.cfg.Check != nil {
			err = s.cfg.Check(rs.Rules)
		}
		if err != nil {
			s.log.Error("the ruleset of the last-known-good copy is refused; starting without it",
				append([]any{"path", path, "version", f.Rules.Version}, rulefile.Problems(err)...)...)
		} else {
			st.rules, s.applied, out.Rules = f.Rules, rs, rs
		}
	}
	s.state = st
	s.cfg.Controls.Replace(st.ControlSet())
	s.countCorrupt()
	return out, nil
}

// errCorruptInCopy is the cause of a corrupt entry the copy recorded.
var errCorruptInCopy = errors.New("corrupt when the last-known-good copy was written")

// applyCopied puts an entry of the copy into st when the bucket's decoder
// accepts it under its KV key (as it would from NATS); others are dropped.
func applyCopied(st *state, bucket, key string, e any) {
	b, err := json.Marshal(e)
	if err != nil {
		return
	}
	if c := fleetkv.Decode(bucket, key, 0, b); c.Corrupt == nil {
		st.Apply(c)
	}
}

// encode renders the state as the last-known-good copy.
func (s *Syncer) encode() ([]byte, error) {
	corrupt := make(map[string]uint64, len(s.state.CorruptLists))
	for k, ce := range s.state.CorruptLists {
		corrupt[k] = ce.Revision
	}
	f := lkg{Format: lkgFormat, SavedAt: time.Now().UTC(), Rules: s.state.rules,
		Blocklist: s.state.Lists, Overrides: s.state.Overrides, CorruptBlocklist: corrupt}
	b, err := json.MarshalIndent(&f, "", " ")
	if err != nil {
		return nil, fmt.Errorf("rulesync: encode last-known-good copy: %w", err)
	}
	return b, nil
}

// writeAtomic replaces dir/name with data: a temporary file in the same
// directory, fsynced, renamed over the copy, and the directory fsynced, so
// a crash leaves the old copy or the new one, never a mix. dir is created
// (0700) when missing; the file is 0600.
func writeAtomic(dir, name string, data []byte) (err error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, name+".*.tmp")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, name)); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
