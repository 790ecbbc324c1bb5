package redisstore

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/redisstore/internal/scriptargs"
)

// The RESP2 encoding of the one command the store sends (EVALSHA, EVAL on
// NOSCRIPT) and the parsing of its reply straight into CounterResults,
// for the lean connections of conn.go. Redis speaks RESP2 on a new
// connection until HELLO asks for more, and the store never asks.

// errProtocol is returned when Redis sends bytes that are not RESP: the
// connection cannot be read any further.
var errProtocol = errors.New("redisstore: redis protocol error")

// replyError is an error reply from Redis ("-NOSCRIPT …", "-READONLY …").
// It implements go-redis's redis.Error, so errors from both clients are
// classified alike (nodeFailure).
type replyError string

func (e replyError) Error() string { return string(e) }

// RedisError marks replyError as a reply from Redis.
func (replyError) RedisError() {}

// hasPrefix reports whether err is a reply error starting with p.
func hasPrefix(err error, p string) bool {
	var re replyError
	if !errors.As(err, &re) {
		return false
	}
	return len(re) >= len(p) && string(re[:len(p)]) == p
}

// appendScriptCall appends the EVALSHA command deciding counters (see
// scriptargs) to b, and returns b and the offset in it at which the
// command's tail (numkeys, KEYS, ARGV) begins, from which appendEval
// builds the EVAL of the same call.
func appendScriptCall(b []byte, sha string, op guard.Op, now, margin int64, counters []guard.Counter) ([]byte, int) {
	b = appendHeader(b, 2+scriptargs.LenOf(counters))
	b = scriptargs.AppendBulk(b, "EVALSHA")
	b = scriptargs.AppendBulk(b, sha)
	tail := len(b)
	return scriptargs.AppendRESP(b, op, now, margin, counters), tail
}

// appendEval appends to b the EVAL of the call cmd holds (an
// appendScriptCall command whose tail starts at tail), with the script's
// source: the fallback after NOSCRIPT, which also loads the script.
func appendEval(b []byte, source string, cmd []byte, tail int) []byte {
	// The array header is the same: EVAL and EVALSHA take the same values.
	end := 0
	for cmd[end] != '\n' {
		end++
	}
	b = append(b, cmd[:end+1]...)
	b = scriptargs.AppendBulk(b, "EVAL")
	b = scriptargs.AppendBulk(b, source)
	return append(b, cmd[tail:]...)
}

func appendHeader(b []byte, n int) []byte {
	b = append(b, '*')
	b = strconv.AppendInt(b, int64(n), 10)
	return append(b, '\r', '\n')
}

// replyReader reads RESP2 replies.
type replyReader struct {
	r *bufio.Reader
}

// line reads one line and returns it without its "\r\n", as a slice into
// the reader's buffer, valid until the next read.
func (rr *replyReader) line() ([]byte, error) {
	b, err := rr.r.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errProtocol
		}
		return nil, err
	}
	if len(b) < 3 || b[len(b)-2] != '\r' {
		return nil, errProtocol
	}
	return b[:len(b)-2], nil
}

// parseInt parses a RESP integer (an optional '-' and decimal digits).
func parseInt(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 20 {
		return 0, false
	}
	neg := b[0] == '-'
	if neg {
		b = b[1:]
		if len(b) == 0 {
			return 0, false
		}
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}

// value is one RESP value as elem reads it.
type value struct {
	kind byte   // ':', '$', '+', '-', '*'
	n    int64  // the integer; a bulk string's or an array's length
	s    []byte // a bulk or simple string, an error's text: valid until the next read
}

// elem reads one value. An array's elements are read and dropped (the
// script's reply holds none nested); n is its length.
func (rr *replyReader) elem() (value, error) { return rr.elemAt(0) }

func (rr *replyReader) elemAt(depth int) (value, error) {
	b, err := rr.line()
	if err != nil {
		return value{}, err
	}
	v := value{kind: b[0]}
	switch v.kind {
	case ':':
		var ok bool
		if v.n, ok = parseInt(b[1:]); !ok {
			return v, errProtocol
		}
	case '+', '-':
		v.s = b[1:]
	case '$':
		var ok bool
		if v.n, ok = parseInt(b[1:]); !ok {
			return v, errProtocol
		}
		if v.n >= 0 {
			v.s, err = rr.bulk(int(v.n))
		}
	case '*':
		var ok bool
		if v.n, ok = parseInt(b[1:]); !ok || depth >= maxDepth {
			return v, errProtocol
		}
		for range v.n {
			if _, err := rr.elemAt(depth + 1); err != nil {
				return v, err
			}
		}
	default:
		return v, errProtocol
	}
	return v, err
}

// maxBulk is the longest bulk string a reply may hold: the script's
// strings are refund tokens of a few dozen bytes; a longer one is not a
// reply of this store's, and is not worth reading into memory.
const maxBulk = 64 << 10

// maxDepth is how deep arrays may nest in a reply the reader skips.
const maxDepth = 8

// bulk reads a bulk string's n bytes and its "\r\n".
func (rr *replyReader) bulk(n int) ([]byte, error) {
	if n > maxBulk {
		return nil, errProtocol
	}
	if n+2 <= rr.r.Size() {
		b, err := rr.r.Peek(n + 2)
		if err != nil {
			return nil, err
		}
		if b[n] != '\r' || b[n+1] != '\n' {
			return nil, errProtocol
		}
		_, _ = rr.r.Discard(n + 2)
		return b[:n], nil
	}
	b := make([]byte, n+2)
	if _, err := io.ReadFull(rr.r, b); err != nil {
		return nil, err
	}
	if b[n] != '\r' || b[n+1] != '\n' {
		return nil, errProtocol
	}
	return b[:n], nil
}

// scriptReply reads one reply to the script into out (one result per
// counter) and returns the decision's time and whether the request was
// admitted. callErr is the call's own failure, with the connection still
// in step: an error reply (replyError), or ErrReply for a reply of another
// shape (read whole). err means the connection cannot be read any further.
func (rr *replyReader) scriptReply(out []guard.CounterResult) (now int64, admitted bool, callErr, err error) {
	b, err := rr.line()
	if err != nil {
		return 0, false, nil, err
	}
	switch b[0] {
	case '-':
		return 0, false, replyError(b[1:]), nil
	case '*':
	default:
		// Not an array: read the rest of this value and say so.
		return 0, false, ErrReply, rr.rest(b)
	}
	n, ok := parseInt(b[1:])
	if !ok {
		return 0, false, nil, errProtocol
	}
	if n != int64(2+8*len(out)) {
		for range n {
			if _, err := rr.elem(); err != nil {
				return 0, false, nil, err
			}
		}
		return 0, false, ErrReply, nil
	}
	bad := false
	num := func() int64 {
		v, e := rr.elem()
		if e != nil {
			err = e
			return 0
		}
		if v.kind != ':' {
			bad = true
		}
		return v.n
	}
	now = num()
	admitted = num() == 1
	for i := range out {
		if err != nil {
			return 0, false, nil, err
		}
		r := &out[i]
		r.Allowed = num() == 1
		r.Charged = num() == 1
		r.Remaining = num()
		r.ResetAfter = num()
		r.NextAfter = num()
		r.RetryAfter = num()
		v, e := rr.elem()
		switch {
		case e != nil:
			return 0, false, nil, e
		case v.kind != '$':
			bad = true
		case len(v.s) == 0:
			r.Token = ""
		default:
			r.Token = string(v.s)
		}
		r.Leased = num()
	}
	if err != nil {
		return 0, false, nil, err
	}
	if bad {
		return 0, false, ErrReply, nil
	}
	return now, admitted, nil, nil
}

// rest reads the remainder of a value whose first line (not an array nor
// an error) was read.
func (rr *replyReader) rest(first []byte) error {
	switch first[0] {
	case ':', '+':
		return nil
	case '$':
		n, ok := parseInt(first[1:])
		if !ok {
			return errProtocol
		}
		if n >= 0 {
			_, err := rr.bulk(int(n))
			return err
		}
		return nil
	}
	return fmt.Errorf("%w: unexpected reply type %q", errProtocol, first[0])
}
