package redisstore

import (
	"crypto/sha1"
	"embed"
	"encoding/hex"
	"strings"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore/internal/luaarith"
	"github.com/tollgate/tollgate/guard/redisstore/internal/scriptargs"
)

//go:embed lua/*.lua regionstore/lua/*.lua
var luaFiles embed.FS

// scriptParts are concatenated, in order, after the exact arithmetic
// (package luaarith), into the one script every call runs: the shared
// prelude, the algorithms, then the driver that reads KEYS and ARGV. Each
// file's header states its inputs and outputs.
var scriptParts = []string{
	"lua/prelude.lua",
	"lua/bucket.lua",
	"lua/fixed_window.lua",
	"lua/sliding_window_counter.lua",
	"lua/sliding_window_log.lua",
	"lua/decide.lua",
}

// regionParts are the region script's: the guard's files, then, as the
// body of one function, gate_parts, the share ledger's files (regionstore's
// own, which it runs for give and receive) and gate.lua, which decides a
// global rule's counter against the ledger; then the driver. Inside the
// function, the ledger's many functions are made only by a call that
// decides a ledger counter.
var regionParts = []string{
	"lua/prelude.lua",
	"lua/bucket.lua",
	"lua/fixed_window.lua",
	"lua/sliding_window_counter.lua",
	"lua/sliding_window_log.lua",
	gateOpen,
	"regionstore/lua/ledger.lua",
	"regionstore/lua/fixed.lua",
	"regionstore/lua/sliding.lua",
	"regionstore/lua/bucket.lua",
	"lua/gate.lua",
	gateClose,
	"lua/decide.lua",
}

// The lines around gate_parts's body in regionParts.
const (
	gateOpen  = "local function gate_parts()"
	gateClose = "end"
)

// Script is the guard's Redis script: its source and SHA-1 (for EVALSHA).
type Script struct {
	Source string
	SHA    string
}

// DecideScript returns the script that decides a request's counters
// (lua/decide.lua describes its KEYS, ARGV and reply).
func DecideScript() Script { return joinScript(scriptParts) }

// RegionScript returns the script a Store sends a call to when one of its
// counters is decided against the region's share ledger
// (guard.Counter.Ledger; lua/gate.lua): DecideScript's with the ledger's
// files. A call without such a counter goes to DecideScript's, so a
// regional rule, and every rule of a single region, run exactly as
// without regions.
func RegionScript() Script { return joinScript(regionParts) }

func joinScript(parts []string) Script {
	var b strings.Builder
	b.WriteString(luaarith.Source)
	b.WriteByte('\n')
	for _, name := range parts {
		if name == gateOpen || name == gateClose {
			b.WriteString(name)
			b.WriteByte('\n')
			continue
		}
		src, err := luaFiles.ReadFile(name)
		if err != nil {
			// The files are embedded at build time; a missing one is a
			// build defect, caught by the package's tests.
			panic("redisstore: missing embedded " + name)
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return NewScript(b.String())
}

// NewScript returns the Script of source src.
func NewScript(src string) Script {
	sum := sha1.Sum([]byte(src))
	return Script{Source: src, SHA: hex.EncodeToString(sum[:])}
}

// ScriptArgs returns the KEYS and ARGV a Store sends to DecideScript's
// script for op on counters, as strings (as redis-cli and redis-benchmark
// take them): now is the decision time in ms (0: the script reads Redis's
// TIME) and margin the TTL margin in ms. It lets a tool outside the store
// replay the store's exact calls, for instance to measure the script alone.
func ScriptArgs(op guard.Op, now, margin int64, counters []guard.Counter) (keys, args []string) {
	return scriptargs.Strings(op, now, margin, counters)
}
