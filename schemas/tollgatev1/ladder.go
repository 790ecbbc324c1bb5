package tollgatev1

// The penalty ladder: the levels the aggregator puts an abusive key at
// (PenaltyEvent.level), and what each level is on the wire — the name of
// a step to it (PenaltyEvent.action) and the KV entries that enforce it
// (ListEntry.Level, OverrideEntry.Level). The aggregator writes the entries
// a level calls for; gateways read an entry's Level and Close by it.

// Penalty ladder levels.
const (
	LevelNone     = 0
	LevelReduced  = 1
	LevelCooldown = 2
	LevelBlock    = 3
	// MaxLevel is the ladder's top.
	MaxLevel = LevelBlock
)

// Rung is what one level of the penalty ladder enforces.
type Rung struct {
	Level int
	// Action names the level: a step to it has this PenaltyEvent.action
	// ("reduced_limit", "cooldown", "blocklist"; "none" at level 0).
	Action string
	// Override: the level is an override of the key's key-scope rules
	// (BucketOverrides, OverrideKey(ScopeKey, key_id)) that scales its
	// limits by the ladder's factor.
	Override bool
	// List: the level is a BucketBlocklist entry under the key_id with
	// this action — ActionPenalty (every request 429 PENALTY) or
	// ActionBlock (every request 403 KEY_BLOCKED); "" for none.
	List string
	// Close: the level answers at the connection level (Connection: close
	// where the peer is the client itself). Entries of lower levels that
	// ask for it are not obeyed.
	Close bool
}

// ladder holds the rungs by level.
var ladder = [MaxLevel + 1]Rung{
	{Level: LevelNone, Action: "none"},
	{Level: LevelReduced, Action: "reduced_limit", Override: true},
	{Level: LevelCooldown, Action: "cooldown", List: ActionPenalty},
	{Level: LevelBlock, Action: "blocklist", List: ActionBlock, Close: true},
}

// LadderRung returns what level enforces. A level below LevelNone
// enforces nothing; one above MaxLevel is the top's.
func LadderRung(level int) Rung {
	return ladder[min(max(level, LevelNone), MaxLevel)]
}
