package state

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/tollgate/tollgate/internal/service"
)

// Snapshots writes consistent checkpoints of a DB into a directory, one
// subdirectory per snapshot named for its UTC time, keeping the newest
// ones. A snapshot is a DB that OpenReadOnly opens (the audit snapshots
// `aggregator audit --snapshot` reads).
type Snapshots struct {
	db   *DB
	dir  string
	keep int
	log  *slog.Logger
}

// NewSnapshots returns the snapshots of db in dir, keeping the newest keep
// (at least one). log may be nil.
func NewSnapshots(db *DB, dir string, keep int, log *slog.Logger) *Snapshots {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Snapshots{db: db, dir: dir, keep: max(keep, 1), log: log}
}

// Dir is where the snapshots are written.
func (s *Snapshots) Dir() string { return s.dir }

// Take writes a snapshot now (named for now) and prunes the oldest beyond
// the number kept; it returns the snapshot's directory.
func (s *Snapshots) Take(now time.Time) (string, error) {
	if err := os.MkdirAll(s.dir, 0o750); err != nil {
		return "", fmt.Errorf("state: snapshot: %w", err)
	}
	dir := filepath.Join(s.dir, now.UTC().Format("20060102T150405.000000000Z"))
	if err := s.db.Checkpoint(dir); err != nil {
		return "", err
	}
	return dir, s.prune()
}

// prune removes the oldest snapshots beyond the number kept.
func (s *Snapshots) prune() error {
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		return fmt.Errorf("state: prune snapshots: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for len(names) > s.keep {
		if err := os.RemoveAll(filepath.Join(s.dir, names[0])); err != nil {
			return fmt.Errorf("state: prune snapshots: %w", err)
		}
		names = names[1:]
	}
	return nil
}

// Run takes a snapshot every interval until ctx is done; a failure is
// logged and the next interval tries again.
func (s *Snapshots) Run(ctx context.Context, every time.Duration) {
	service.Every(ctx, every, func(now time.Time) {
		if dir, err := s.Take(now); err != nil {
			s.log.Error("snapshot failed", slog.String("error", err.Error()))
		} else {
			s.log.Info("snapshot written", slog.String("dir", dir))
		}
	})
}
