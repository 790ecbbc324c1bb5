// Package scriptargs lays out the KEYS and ARGV of the guard's Redis
// script (guard/redisstore/lua/decide.lua): the store sends them, and
// redisstore.ScriptArgs hands them to tools that replay them (the EVALSHA
// benchmark, loadtest/cmd/evalbench, with redis-benchmark).
package scriptargs

import (
	"fmt"
	"strconv"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

var algoCodes = map[rules.Algorithm]int64{
	rules.TokenBucket:          1,
	rules.GCRA:                 2,
	rules.FixedWindow:          3,
	rules.SlidingWindowCounter: 4,
	rules.SlidingWindowLog:     5,
}

var opCodes = map[guard.Op]int64{
	guard.OpCheck:    1,
	guard.OpPeek:     2,
	guard.OpReport:   3,
	guard.OpReset:    4,
	guard.OpAddQuota: 5,
	guard.OpRefund:   6,
	guard.OpState:    7,
	guard.OpReturn:   8,
}

// ledgerCode is the algorithm code of a counter decided against the
// region's share ledger (lua/gate.lua).
const ledgerCode = 6

// LedgerSuffix joins a counter's name and the region's in its ledger's
// key (regionstore's naming).
const LedgerSuffix = ":region:"

// Ledger reports whether some counter is decided against the region's
// share ledger: the call then goes to the region script (lua/gate.lua),
// and its ARGV ends with the skew bound and the period.
func Ledger(counters []guard.Counter) *guard.Ledger {
	for i := range counters {
		if l := counters[i].Ledger; l != nil {
			return l
		}
	}
	return nil
}

// Build lays out KEYS and ARGV as lua/decide.lua reads them: op, the
// decision time (0: Redis TIME), the TTL margin in ms, then ten values per
// counter, then, when a counter is decided against the share ledger, the
// skew bound and the period. The slices are new on every call.
func Build(op guard.Op, now, margin int64, counters []guard.Counter) ([]string, []any) {
	keys := make([]string, len(counters))
	args := make([]any, 0, 5+10*len(counters))
	args = append(args, opCodes[op], now, margin)
	for i := range counters {
		c := &counters[i]
		keys[i] = c.Name
		code, a, b, cc, d := counterParams(c)
		if c.Ledger != nil {
			keys[i] = c.Name + LedgerSuffix + c.Ledger.Region
		}
		shadow := int64(0)
		if c.Shadow {
			shadow = 1
		}
		args = append(args, code, c.Cost, shadow, c.Token, a, b, cc, d, c.Lease, c.Return)
	}
	if l := Ledger(counters); l != nil {
		args = append(args, l.Skew, l.Period)
	}
	return keys, args
}

// counterParams is a counter's algorithm code and its four parameters.
func counterParams(c *guard.Counter) (code, a, b, cc, d int64) {
	if l := c.Ledger; l != nil {
		kind := int64(1) // fixed window
		switch {
		case c.Algorithm.Bucket():
			kind = 3
		case c.Algorithm != rules.FixedWindow:
			kind = 2
		}
		return ledgerCode, kind, l.Limit, l.Window, l.Static
	}
	a, b, cc, d = Params(c.Algorithm, c.Params)
	return algoCodes[c.Algorithm], a, b, cc, d
}

// Len is the number of values AppendRESP appends for n counters none of
// which is decided against the share ledger: numkeys, the keys, and ARGV.
func Len(n int) int { return 1 + n + 3 + 10*n }

// LenOf is the number of values AppendRESP appends for counters.
func LenOf(counters []guard.Counter) int {
	if Ledger(counters) != nil {
		return Len(len(counters)) + 2
	}
	return Len(len(counters))
}

// AppendRESP appends numkeys, KEYS and ARGV as Build lays them out, each a
// RESP bulk string, to b: the tail of an EVAL or EVALSHA command whose
// array header counts 2 + Len(len(counters)) values. It allocates nothing
// beyond growing b, so a caller reusing b sends a call with no
// allocation.
func AppendRESP(b []byte, op guard.Op, now, margin int64, counters []guard.Counter) []byte {
	b = appendInt(b, int64(len(counters)))
	for i := range counters {
		if l := counters[i].Ledger; l != nil {
			b = appendLedgerKey(b, counters[i].Name, l.Region)
			continue
		}
		b = AppendBulk(b, counters[i].Name)
	}
	b = appendInt(b, opCodes[op])
	b = appendInt(b, now)
	b = appendInt(b, margin)
	for i := range counters {
		c := &counters[i]
		code, a, pb, pc, pd := counterParams(c)
		shadow := int64(0)
		if c.Shadow {
			shadow = 1
		}
		b = appendInt(b, code)
		b = appendInt(b, c.Cost)
		b = appendInt(b, shadow)
		b = AppendBulk(b, c.Token)
		b = appendInt(b, a)
		b = appendInt(b, pb)
		b = appendInt(b, pc)
		b = appendInt(b, pd)
		b = appendInt(b, c.Lease)
		b = appendInt(b, c.Return)
	}
	if l := Ledger(counters); l != nil {
		b = appendInt(b, l.Skew)
		b = appendInt(b, l.Period)
	}
	return b
}

// appendLedgerKey appends a counter's ledger key as a RESP bulk string,
// without building the string.
func appendLedgerKey(b []byte, name, region string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(name)+len(LedgerSuffix)+len(region)), 10)
	b = append(b, '\r', '\n')
	b = append(b, name...)
	b = append(b, LedgerSuffix...)
	b = append(b, region...)
	return append(b, '\r', '\n')
}

// AppendBulk appends s as a RESP bulk string.
func AppendBulk(b []byte, s string) []byte {
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, '\r', '\n')
	b = append(b, s...)
	return append(b, '\r', '\n')
}

// appendInt appends x in decimal as a RESP bulk string.
func appendInt(b []byte, x int64) []byte {
	var d [20]byte
	digits := strconv.AppendInt(d[:0], x, 10)
	b = append(b, '$')
	b = strconv.AppendInt(b, int64(len(digits)), 10)
	b = append(b, '\r', '\n')
	b = append(b, digits...)
	return append(b, '\r', '\n')
}

// Params returns the four algorithm parameters (a, b, c, d) the script
// takes for a counter; see each algorithm's file.
func Params(alg rules.Algorithm, p rules.Params) (a, b, c, d int64) {
	switch alg {
	case rules.FixedWindow, rules.SlidingWindowLog:
		return p.Limit, p.Window, 0, 0
	case rules.SlidingWindowCounter:
		s, q := guard.WindowScale(p)
		return p.Limit, s, max(p.Precision, 1), q
	default:
		a, b, k := guard.BucketScale(p)
		return p.Limit, a, b, k
	}
}

// Strings is Build's KEYS and ARGV as strings, as redis-cli and
// redis-benchmark take them.
func Strings(op guard.Op, now, margin int64, counters []guard.Counter) (keys, args []string) {
	keys, av := Build(op, now, margin, counters)
	args = make([]string, len(av))
	for i, v := range av {
		switch v := v.(type) {
		case int64:
			args[i] = strconv.FormatInt(v, 10)
		case string:
			args[i] = v
		default:
			args[i] = fmt.Sprint(v)
		}
	}
	return keys, args
}
