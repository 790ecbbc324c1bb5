package rulesync

import (
	"context"
	"log/slog"
	"time"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// The gateway's log says once per key and level that the penalty ladder
// moved a key: when an entry of the ladder (level > 0) arrives
// that puts the key at another level than the one last logged, and when the
// key's last ladder entry goes. Keys are named by key_id and the entry's
// short key prefix, never by the key. A burst of moves (a thousand keys
// stepping down together) is rate-limited: at most ladderLogBurst lines at
// once, ladderLogRate a second after that, and the next line says how
// many were left out.
//
// A step replaces one ladder entry with another (level 1's override by
// level 2's blocklist entry), which the gateway sees as two changes; when
// the old entry goes first, the key is at level 0 for a moment. So the end
// of a key's penalty is logged only once it has lasted ladderEndDelay:
// an entry that arrives sooner is one move, from the level before.

const (
	ladderLogBurst = 20
	ladderLogRate  = 10 // lines per second
	ladderEndDelay = time.Second
)

// ladderLog is what the Syncer last logged of the ladder. Owned by Run's
// goroutine.
type ladderLog struct {
	levels     map[string]int        // key_id -> level last logged (absent: 0)
	ending     map[string]ladderGone // key_id -> the end of its penalty, not logged yet
	tokens     float64
	refilled   time.Time
	suppressed int
}

// ladderGone is a key whose last ladder entry went.
type ladderGone struct {
	prev int // the level it left
	at   time.Time
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
	if e := s.state.Lists[tollgatev1.BlocklistKey(keyID)]; e != nil && e.Level > tollgatev1.LevelNone && tollgatev1.Live(e.ExpiresAt, now) {
		st = ladderState{level: e.Level, prefix: e.KeyPrefix, expires: e.ExpiresAt}
	}
	if e := s.state.Overrides[tollgatev1.OverrideKey(tollgatev1.ScopeKey, keyID)]; e != nil && e.Level > st.level && tollgatev1.Live(e.ExpiresAt, now) {
		st = ladderState{level: e.Level, prefix: e.KeyPrefix, expires: e.ExpiresAt}
	}
	st.action = tollgatev1.LadderRung(st.level).Action
	return st
}

// ladderKeyID returns the key_id whose place on the ladder the entry
// under kvKey in bucket may hold: a blocklist bucket's block or penalty
// entry, or a key override; "" for none.
func (s *Syncer) ladderKeyID(bucket, kvKey string) string {
	switch bucket {
	case tollgatev1.BucketBlocklist:
		if e := s.state.Lists[kvKey]; e != nil && e.Action != tollgatev1.ActionAllow {
			return e.KeyID
		}
	case tollgatev1.BucketOverrides:
		if e := s.state.Overrides[kvKey]; e != nil && e.Scope == tollgatev1.ScopeKey {
			return e.Subject
		}
	}
	return ""
}

// noteLadder logs keyID's move on the ladder, if it moved since the last
// line about it.
func (s *Syncer) noteLadder(keyID string) {
	now := time.Now()
	s.flushLadderEnds(now)
	l := &s.ladder
	st := s.ladderOf(keyID, now)
	prev := l.levels[keyID]
	if g, ok := l.ending[keyID]; ok && st.level > 0 {
		// The old entry went first, the new one came: one move.
		delete(l.ending, keyID)
		prev = g.prev
	}
	if st.level > 0 {
		if l.levels == nil {
			l.levels = map[string]int{}
		}
		l.levels[keyID] = st.level
	}
	switch {
	case st.level == prev:
		return
	case st.level == 0:
		delete(l.levels, keyID)
		if l.ending == nil {
			l.ending = map[string]ladderGone{}
		}
		l.ending[keyID] = ladderGone{prev: prev, at: now}
		return
	}
	s.logLadder(keyID, st, prev, now)
}

// flushLadderEnds logs the ends of penalties that have lasted
// ladderEndDelay. Run's session calls it every ladderEndDelay too.
func (s *Syncer) flushLadderEnds(now time.Time) {
	for keyID, g := range s.ladder.ending {
		if now.Sub(g.at) >= ladderEndDelay {
			delete(s.ladder.ending, keyID)
			s.logLadder(keyID, ladderState{}, g.prev, now)
		}
	}
}

// logLadder writes the line of one move, within the rate limit.
func (s *Syncer) logLadder(keyID string, st ladderState, prev int, now time.Time) {
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
	for keyID := range s.ladder.ending {
		note(keyID)
	}
	for _, e := range s.state.Lists {
		if e.Level > 0 {
			note(e.KeyID)
		}
	}
	for _, e := range s.state.Overrides {
		if e.Level > 0 && e.Scope == tollgatev1.ScopeKey {
			note(e.Subject)
		}
	}
}
