package tollgatev1

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

// The values of the NATS KV buckets are JSON documents (the operator API
// writes them, gateways watch them; the `nats` CLI shows them as they
// are). Like the protobuf messages they evolve by adding fields only.

// RulesEntry is the value under RulesKey in BucketRules: a ruleset as the
// operator sent it (YAML or JSON, comments kept) with the version the
// operator API assigned. Gateways put Document (else Source) in force
// and report Version.
type RulesEntry struct {
	Version int64     `json:"version"`
	Source  string    `json:"source"`
	Format  string    `json:"format"` // "yaml" or "json"
	Actor   string    `json:"actor,omitempty"`
	Reason  string    `json:"reason,omitempty"`
	Time    time.Time `json:"time"`
	// Document is Source parsed, in rules.EncodeDocument's form (compact
	// JSON), which the operator API adds when it writes the entry and the
	// value stays within NATS's limit: a gateway decodes it instead of
	// parsing Source, and parses Source when it is absent or does not
	// decode and compile cleanly. Source stays the authority.
	Document json.RawMessage `json:"document,omitempty"`
}

// CountersChanged is a message on SubjectCounters: the operator API reset
// a key's counters or granted it quota (Kind "reset" or "quota"), or the
// region's agent applied a loan to them (Kind "loan", no KeyID). Counters
// names them as the gateways' guards do (guard.Counter.Name, under the
// same ruleset, key secret and Redis key prefix); without them a gateway
// drops its local state of every counter.
type CountersChanged struct {
	Kind     string    `json:"kind"`
	KeyID    string    `json:"key_id"`
	Counters []string  `json:"counters,omitempty"`
	Time     time.Time `json:"time"`
}

// Kinds of CountersChanged.
const (
	CountersReset = "reset"
	CountersQuota = "quota"
	// CountersLoan: units lent by another region landed on the counters
	// (a global rule's share grew); like a quota grant, gateways drop
	// their negative cache of them.
	CountersLoan = "loan"
)

// ListEntry is a value of BucketBlocklist: a blocked, penalised or
// allowlisted key.
type ListEntry struct {
	KeyID     string `json:"key_id"`
	KeyPrefix string `json:"key_prefix,omitempty"`
	// Action: "block" (403 KEY_BLOCKED), "penalty" (429 PENALTY with
	// Retry-After until ExpiresAt; the penalty ladder's level 2 and up) or
	// "allow" (bypass every limit).
	Action string `json:"action"`
	// Level is the penalty ladder's level (0 for operator entries, which
	// the ladder never replaces or deletes).
	Level int `json:"level,omitempty"`
	// Step is the ladder's step counter of the key when the ladder wrote
	// the entry (PenaltyEvent.step): a write of a lower step never replaces
	// it. 0 for operator entries.
	Step uint64 `json:"step,omitempty"`
	// Close asks gateways to answer at the connection level (Connection:
	// close) where the peer is the client itself.
	Close     bool      `json:"close,omitempty"`
	Reason    string    `json:"reason,omitempty"`
	Actor     string    `json:"actor,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt is when the entry stops applying; zero: never.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// List actions.
const (
	ActionBlock   = "block"
	ActionPenalty = "penalty"
	ActionAllow   = "allow"
)

// OverrideEntry is a value of BucketOverrides: a temporary change of the
// limits of a key's key-scope rules or a tenant's tenant-scope rules.
// Exactly one of Limit (absolute: the rule's limit, capacity or burst
// becomes Limit and its rate scales with it) and Factor (limit and rate
// scale by Factor) is set.
type OverrideEntry struct {
	Scope     string    `json:"scope"` // "key" or "tenant"
	Subject   string    `json:"subject"`
	KeyPrefix string    `json:"key_prefix,omitempty"`
	Rule      string    `json:"rule,omitempty"` // one rule only; empty: every rule of the scope
	Limit     int64     `json:"limit,omitempty"`
	Factor    float64   `json:"factor,omitempty"`
	Level     int       `json:"level,omitempty"` // set by the penalty ladder
	Step      uint64    `json:"step,omitempty"`  // the ladder's step counter of the key (see ListEntry.Step)
	Reason    string    `json:"reason,omitempty"`
	Actor     string    `json:"actor,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// Override scopes.
const (
	ScopeKey    = "key"
	ScopeTenant = "tenant"
)

// GatewayEntry is a value of BucketGateways: a gateway in fleet mode says
// it is alive and which rules it runs, under GatewayKey(GatewayID). It
// writes the entry at start, after every ruleset it puts in force and
// every few seconds, and deletes it when it stops; the bucket's MaxAge
// removes the entry of a gateway that stopped without deleting it. It
// holds no API key.
type GatewayEntry struct {
	GatewayID string `json:"gateway_id"`
	Region    string `json:"region,omitempty"`
	// RulesVersion is the version of the ruleset in force (the operator
	// API's version when it came from BucketRules); RulesHash its
	// version and content hash as the gateway's /readyz shows it.
	RulesVersion int64  `json:"rules_version"`
	RulesHash    string `json:"rules_hash,omitempty"`
	// RulesSource is where the ruleset in force came from: "nats", "lkg"
	// (the last-known-good copy on disk, NATS not read yet) or "file"
	// (rules_file).
	RulesSource string `json:"rules_source"`
	// NATSSynced: the gateway has read the buckets whole since it started.
	NATSSynced bool      `json:"nats_synced,omitempty"`
	Build      string    `json:"build,omitempty"`
	StartedAt  time.Time `json:"started_at"`
	// Time is when the gateway wrote the entry (its own clock).
	Time time.Time `json:"time"`
}

// Rules sources of a GatewayEntry.
const (
	RulesFromNATS = "nats"
	RulesFromLKG  = "lkg"
	RulesFromFile = "file"
)

// GatewayKey names a gateway's entry in BucketGateways: its gateway_id,
// which CheckGatewayID accepts.
func GatewayKey(gatewayID string) string { return gatewayID }

// CheckGatewayID checks that a gateway_id can name its entry in
// BucketGateways: 1 to 256 characters from a-z, A-Z, 0-9 and - _ = .,
// neither starting nor ending with a dot (the characters NATS KV keys
// allow, less the / that gateway_id refuses).
func CheckGatewayID(id string) error {
	if id == "" || len(id) > 256 {
		return errors.New("gateway_id: 1 to 256 characters")
	}
	for _, r := range id {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-', r == '_', r == '=', r == '.':
		default:
			return fmt.Errorf("gateway_id %q: only a-z, A-Z, 0-9 and - _ = . name a NATS KV key", id)
		}
	}
	if id[0] == '.' || id[len(id)-1] == '.' || strings.Contains(id, "..") {
		return fmt.Errorf("gateway_id %q: a NATS KV key neither starts nor ends with a dot, nor holds two in a row", id)
	}
	return nil
}

// CheckGatewayKey checks that a BucketGateways entry sits under the KV key
// its gateway_id names.
func CheckGatewayKey(kvKey string, e *GatewayEntry) error {
	if want := GatewayKey(e.GatewayID); kvKey != want {
		return fmt.Errorf("the entry of gateway %q belongs under KV key %q", e.GatewayID, want)
	}
	return nil
}

// DecodeGatewayEntry decodes and checks a BucketGateways value.
func DecodeGatewayEntry(b []byte) (*GatewayEntry, error) {
	var e GatewayEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("gateway entry: %w", err)
	}
	if err := CheckGatewayID(e.GatewayID); err != nil {
		return nil, fmt.Errorf("gateway entry: %w", err)
	}
	if e.RulesVersion < 0 {
		return nil, errors.New("gateway entry: rules_version below 0")
	}
	return &e, nil
}

// Live reports whether an entry expiring at exp applies at now.
func Live(exp, now time.Time) bool { return exp.IsZero() || exp.After(now) }

// BlocklistKey names a blocked or penalised key's entry: its key_id.
func BlocklistKey(keyID string) string { return keyID }

// AllowlistKey names an allowlisted key's entry in BucketBlocklist.
func AllowlistKey(keyID string) string { return "allow." + keyID }

// OverrideKey names an override: key.<key_id> or tenant.<base64url tenant>
// (tenants may hold characters KV keys do not allow).
func OverrideKey(scope, subject string) string {
	if scope == ScopeTenant {
		return "tenant." + base64.RawURLEncoding.EncodeToString([]byte(subject))
	}
	return "key." + subject
}

// CheckListKey checks that a BucketBlocklist entry sits under the KV key
// its content names: BlocklistKey(key_id) for block and penalty,
// AllowlistKey(key_id) for allow. Every KV key then holds one kind of
// control of one key_id; an entry elsewhere is corrupt (both ends, the
// operator API and the gateways, treat it so).
func CheckListKey(kvKey string, e *ListEntry) error {
	want := BlocklistKey(e.KeyID)
	if e.Action == ActionAllow {
		want = AllowlistKey(e.KeyID)
	}
	if kvKey != want {
		return fmt.Errorf("a %s entry for key_id %s belongs under KV key %q", e.Action, e.KeyID, want)
	}
	return nil
}

// CheckOverrideKey checks that a BucketOverrides entry sits under the KV
// key its scope and subject name (OverrideKey).
func CheckOverrideKey(kvKey string, e *OverrideEntry) error {
	if want := OverrideKey(e.Scope, e.Subject); kvKey != want {
		return fmt.Errorf("a %s override belongs under KV key %q", e.Scope, want)
	}
	return nil
}

// ParseOverrideKey is the inverse of OverrideKey.
func ParseOverrideKey(k string) (scope, subject string, err error) {
	if s, ok := strings.CutPrefix(k, "key."); ok {
		return ScopeKey, s, nil
	}
	if s, ok := strings.CutPrefix(k, "tenant."); ok {
		b, err := base64.RawURLEncoding.DecodeString(s)
		if err != nil {
			return "", "", fmt.Errorf("override key %q: %w", k, err)
		}
		return ScopeTenant, string(b), nil
	}
	return "", "", fmt.Errorf("override key %q: want key.<key_id> or tenant.<base64url>", k)
}

// DecodeListEntry decodes and checks a BucketBlocklist value.
func DecodeListEntry(b []byte) (*ListEntry, error) {
	var e ListEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("blocklist entry: %w", err)
	}
	switch e.Action {
	case ActionBlock, ActionPenalty, ActionAllow:
	default:
		return nil, fmt.Errorf("blocklist entry: action %q is not block, penalty or allow", e.Action)
	}
	if e.KeyID == "" {
		return nil, errors.New("blocklist entry: key_id missing")
	}
	return &e, nil
}

// DecodeOverrideEntry decodes and checks a BucketOverrides value.
func DecodeOverrideEntry(b []byte) (*OverrideEntry, error) {
	var e OverrideEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("override entry: %w", err)
	}
	if e.Scope != ScopeKey && e.Scope != ScopeTenant {
		return nil, fmt.Errorf("override entry: scope %q is not key or tenant", e.Scope)
	}
	if e.Subject == "" {
		return nil, errors.New("override entry: subject missing")
	}
	if (e.Limit > 0) == (e.Factor > 0) || e.Limit < 0 || e.Factor < 0 {
		return nil, errors.New("override entry: exactly one of limit (> 0) and factor (> 0)")
	}
	return &e, nil
}

// DecodeRulesEntry decodes a BucketRules value (the ruleset itself is
// validated by its reader).
func DecodeRulesEntry(b []byte) (*RulesEntry, error) {
	var e RulesEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return nil, fmt.Errorf("rules entry: %w", err)
	}
	if e.Source == "" {
		return nil, errors.New("rules entry: source missing")
	}
	return &e, nil
}
