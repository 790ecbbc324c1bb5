package rulesync

import (
	"context"
	"log/slog"
	"time"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// The gateway's log says once per key and level that the penalty ladder
// moved a key (SPEC §6): when an entry of the ladder (level > 0) arrives
// that puts the key at another level than the one last logged, and when the
// key's last ladder entry goes. Keys are named by key_id and the entry's
// short key prefix, never by the key. A burst of moves (a thousand keys
// stepping down together) is rate-limited: at most ladderLogBurst lines at
// once, ladderLogRate a second after that, and the next line says how
// many were left out.

const (
	ladderLogBurst = 20
	ladderLogRate  = 10 // lines per second
)

// Ladder actions as logged.
const (
	actionReducedLimit = "reduced_limit"
	actionCooldown     = "cooldown"
	actionBlocklist    = "blocklist"
)

// ladderLog is what the Syncer last logged of the ladder. Owned by Run's
// goroutine.
type ladderLog struct {
	levels     map[string]int // key_id -> level last logged (absent: 0)
	tokens     float64
	refilled   time.Time
	suppressed int
}

// ladderState is a key's place on the ladder in the Syncer's state.
type ladderState struct {
	level   int
	action  string
	prefix  string
	expires time.Time
}

// ladderOf returns keyID's place on the ladder: its live ladder entries'
// highest level (0 without one).
func (s *Syncer) ladderOf(keyID string, now time.Time) ladderState {
	var st ladderState
	if e := s.state.lists[tollgatev1.BlocklistKey(keyID)]; e != nil && e.Level > 0 && tollgatev1.Live(e.ExpiresAt, now) {
		st = ladderState{level: e.Level, action: actionCooldown, prefix: e.KeyPrefix, expires: e.ExpiresAt}
		if e.Action == tollgatev1.ActionBlock {
			st.action = actionBlocklist
		}
	}
	if e := s.state.overrides[tollgatev1.OverrideKey(tollgatev1.ScopeKey, keyID)]; e != nil && e.Level > st.level && tollgatev1.Live(e.ExpiresAt, now) {
		st = ladderState{level: e.Level, action: actionReducedLimit, prefix: e.KeyPrefix, expires: e.ExpiresAt}
	}
	return st
}

// noteLadder logs keyID's move on the ladder, if it moved since the last
// line about it.
func (s *Syncer) noteLadder(keyID string) {
	now := time.Now()
	st := s.ladderOf(keyID, now)
	prev := s.ladder.levels[keyID]
	if st.level == prev {
		return
	}
	if st.level == 0 {
		delete(s.ladder.levels, keyID)
	} else {
		if s.ladder.levels == nil {
			s.ladder.levels = map[string]int{}
		}
		s.ladder.levels[keyID] = st.level
	}
	if !s.ladderBudget(now) {
		return
	}
	attrs := []slog.Attr{slog.String("key_id", keyID), slog.Int("level", st.level), slog.Int("previous_level", prev)}
	if st.prefix != "" {
		attrs = append(attrs, slog.String("key_prefix", st.prefix))
	}
	if n := s.ladder.suppressed; n > 0 {
		attrs = append(attrs, slog.Int("moves_not_logged", n))
		s.ladder.suppressed = 0
	}
	msg := "key penalised"
	switch {
	case st.level == 0:
		msg = "key penalty ended"
	case st.level < prev:
		msg = "key penalty stepped down"
	}
	if st.level > 0 {
		attrs = append(attrs, slog.String("action", st.action))
		if !st.expires.IsZero() {
			attrs = append(attrs, slog.Time("until", st.expires))
		}
	}
	s.log.LogAttrs(context.Background(), slog.LevelInfo, msg, attrs...)
}

// ladderBudget takes one line from the rate limit, or counts a line left
// out.
func (s *Syncer) ladderBudget(now time.Time) bool {
	l := &s.ladder
	if l.refilled.IsZero() {
		l.tokens = ladderLogBurst
	} else {
		l.tokens = min(ladderLogBurst, l.tokens+now.Sub(l.refilled).Seconds()*ladderLogRate)
	}
	l.refilled = now
	if l.tokens < 1 {
		l.suppressed++
		return false
	}
	l.tokens--
	return true
}

// noteLadderAll logs the moves of every key after a resync: those with a
// ladder entry now and those logged before.
func (s *Syncer) noteLadderAll() {
	seen := map[string]bool{}
	note := func(keyID string) {
		if !seen[keyID] {
			seen[keyID] = true
			s.noteLadder(keyID)
		}
	}
	for keyID := range s.ladder.levels {
		note(keyID)
	}
	for _, e := range s.state.lists {
		if e.Level > 0 {
			note(e.KeyID)
		}
	}
	for _, e := range s.state.overrides {
		if e.Level > 0 && e.Scope == tollgatev1.ScopeKey {
			note(e.Subject)
		}
	}
}
