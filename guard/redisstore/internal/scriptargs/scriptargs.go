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

// Build lays out KEYS and ARGV as lua/decide.lua reads them: op, the
// decision time (0: Redis TIME), the TTL margin in ms, then ten values per
// counter. The slices are new on every call.
func Build(op guard.Op, now, margin int64, counters []guard.Counter) ([]string, []any) {
	keys := make([]string, len(counters))
	args := make([]any, 0, 3+10*len(counters))
	args = append(args, opCodes[op], now, margin)
	for i := range counters {
		c := &counters[i]
		keys[i] = c.Name
		a, b, cc, d := Params(c.Algorithm, c.Params)
		shadow := int64(0)
		if c.Shadow {
			shadow = 1
		}
		args = append(args, algoCodes[c.Algorithm], c.Cost, shadow, c.Token, a, b, cc, d, c.Lease, c.Return)
	}
	return keys, args
}

// Len is the number of values AppendRESP appends for n counters: numkeys,
// the keys, and ARGV.
func Len(n int) int { return 1 + n + 3 + 10*n }

// AppendRESP appends numkeys, KEYS and ARGV as Build lays them out, each a
// RESP bulk string, to b: the tail of an EVAL or EVALSHA command whose
// array header counts 2 + Len(len(counters)) values. It allocates nothing
// beyond growing b, so a caller reusing b sends a call with no
// allocation.
func AppendRESP(b []byte, op guard.Op, now, margin int64, counters []guard.Counter) []byte {
	b = appendInt(b, int64(len(counters)))
	for i := range counters {
		b = AppendBulk(b, counters[i].Name)
	}
	b = appendInt(b, opCodes[op])
	b = appendInt(b, now)
	b = appendInt(b, margin)
	for i := range counters {
		c := &counters[i]
		a, pb, pc, pd := Params(c.Algorithm, c.Params)
		shadow := int64(0)
		if c.Shadow {
			shadow = 1
		}
		b = appendInt(b, algoCodes[c.Algorithm])
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
	return b
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
