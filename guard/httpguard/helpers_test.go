package httpguard

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/httptoken"
)

// fakeChecker is a guard.Checker test double: fn decides.
// fakeChecker answers CheckInto with fn; the middleware calls nothing
// else (the embedded nil Checker would panic if it did).
type fakeChecker struct {
	guard.Checker
	fn func(req *guard.Request, d *guard.Decision) error
}

func (f *fakeChecker) CheckInto(_ context.Context, req *guard.Request, d *guard.Decision) error {
	return f.fn(req, d)
}

var _ guard.Checker = (*fakeChecker)(nil)

// decide returns a fakeChecker that answers every request with a copy of d.
func decide(d guard.Decision) *fakeChecker {
	return &fakeChecker{fn: func(_ *guard.Request, out *guard.Decision) error {
		rules := append(out.Rules[:0], d.Rules...)
		*out = d
		out.Rules = rules
		return nil
	}}
}

// sfToken is an RFC 9651 Token (as opposed to a String).
type sfToken string

// sfParam is one parameter of an Item.
type sfParam struct {
	Key   string
	Value any // int64, float64, string, sfToken, bool, []byte
}

// sfItem is one Item of a List.
type sfItem struct {
	Value  any
	Params []sfParam
}

// Param returns the value of parameter key.
func (it sfItem) Param(key string) (any, bool) {
	for _, p := range it.Params {
		if p.Key == key {
			return p.Value, true
		}
	}
	return nil, false
}

// parseSFList parses an RFC 9651 List field value (§4.2.1) of Items; Inner
// Lists, Dates and Display Strings are refused (Tollgate sends none).
func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	p.skip(" ")
	var list []sfItem
	for !p.done() {
		it, err := p.item()
		if err != nil {
			return nil, err
		}
		list = append(list, it)
		p.skip(" \t")
		if p.done() {
			return list, nil
		}
		if p.s[p.i] != ',' {
			return nil, p.errorf("want ',' after item")
		}
		p.i++
		p.skip(" \t")
		if p.done() {
			return nil, p.errorf("trailing comma")
		}
	}
	return list, nil
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) done() bool { return p.i >= len(p.s) }

func (p *sfParser) skip(set string) {
	for !p.done() && strings.IndexByte(set, p.s[p.i]) >= 0 {
		p.i++
	}
}

func (p *sfParser) errorf(format string, args ...any) error {
	return fmt.Errorf("sf: offset %d in %q: %s", p.i, p.s, fmt.Sprintf(format, args...))
}

func (p *sfParser) item() (sfItem, error) {
	v, err := p.bareItem()
	if err != nil {
		return sfItem{}, err
	}
	params, err := p.params()
	return sfItem{Value: v, Params: params}, err
}

func (p *sfParser) params() ([]sfParam, error) {
	var params []sfParam
	for !p.done() && p.s[p.i] == ';' {
		p.i++
		p.skip(" ")
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		var v any = true
		if !p.done() && p.s[p.i] == '=' {
			p.i++
			if v, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		replaced := false
		for j := range params {
			if params[j].Key == key {
				params[j].Value, replaced = v, true
			}
		}
		if !replaced {
			params = append(params, sfParam{key, v})
		}
	}
	return params, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.done() || !(p.s[p.i] == '*' || 'a' <= p.s[p.i] && p.s[p.i] <= 'z') {
		return "", p.errorf("bad key")
	}
	for !p.done() {
		c := p.s[p.i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || strings.IndexByte("_-.*", c) >= 0) {
			break
		}
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareItem() (any, error) {
	if p.done() {
		return nil, p.errorf("want bare item")
	}
	switch c := p.s[p.i]; {
	case c == '-' || '0' <= c && c <= '9':
		return p.number()
	case c == '"':
		return p.str()
	case c == '*' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
		return p.token(), nil
	case c == '?':
		if p.i+1 < len(p.s) && (p.s[p.i+1] == '0' || p.s[p.i+1] == '1') {
			p.i += 2
			return p.s[p.i-1] == '1', nil
		}
		return nil, p.errorf("bad boolean")
	}
	return nil, p.errorf("unsupported bare item")
}

func (p *sfParser) number() (any, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	digits, dot := 0, -1
	for !p.done() {
		c := p.s[p.i]
		if c == '.' && dot < 0 {
			if digits > 12 {
				return nil, p.errorf("decimal too long")
			}
			dot = digits
			p.i++
			continue
		}
		if c < '0' || c > '9' {
			break
		}
		digits++
		p.i++
	}
	num := p.s[start:p.i]
	switch {
	case digits == 0:
		return nil, p.errorf("no digits")
	case dot < 0 && digits > 15:
		return nil, p.errorf("integer too long")
	case dot < 0:
		return strconv.ParseInt(num, 10, 64)
	case digits-dot == 0 || digits-dot > 3:
		return nil, p.errorf("bad fraction")
	}
	return strconv.ParseFloat(num, 64)
}

func (p *sfParser) str() (any, error) {
	p.i++ // opening quote
	var b strings.Builder
	for !p.done() {
		c := p.s[p.i]
		p.i++
		switch {
		case c == '\\':
			if p.done() || (p.s[p.i] != '"' && p.s[p.i] != '\\') {
				return nil, p.errorf("bad escape")
			}
			b.WriteByte(p.s[p.i])
			p.i++
		case c == '"':
			return b.String(), nil
		case c < 0x20 || c > 0x7e:
			return nil, p.errorf("bad string byte %#x", c)
		default:
			b.WriteByte(c)
		}
	}
	return nil, p.errorf("unterminated string")
}

func (p *sfParser) token() sfToken {
	start := p.i
	p.i++
	for !p.done() && (httptoken.Char(p.s[p.i]) || p.s[p.i] == ':' || p.s[p.i] == '/') {
		p.i++
	}
	return sfToken(p.s[start:p.i])
}

func TestParseSFList(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		in   string
		want []sfItem
		bad  bool
	}{
		{name: "empty", in: "", want: nil},
		{name: "one", in: `"search";q=30;w=60`, want: []sfItem{{"search", []sfParam{{"q", int64(30)}, {"w", int64(60)}}}}},
		{name: "two", in: `"a";r=1, "b";r=2;t=3`, want: []sfItem{
			{"a", []sfParam{{"r", int64(1)}}},
			{"b", []sfParam{{"r", int64(2)}, {"t", int64(3)}}},
		}},
		{name: "escapes", in: `"a\"b\\c"`, want: []sfItem{{`a"b\c`, nil}}},
		{name: "token bool decimal", in: `tok;x;y=?0;z=-1.5`, want: []sfItem{
			{sfToken("tok"), []sfParam{{"x", true}, {"y", false}, {"z", -1.5}}},
		}},
		{name: "duplicate param keeps last", in: `"a";q=1;q=2`, want: []sfItem{{"a", []sfParam{{"q", int64(2)}}}}},
		{name: "trailing comma", in: `"a",`, bad: true},
		{name: "unterminated", in: `"a`, bad: true},
		{name: "bad escape", in: `"a\n"`, bad: true},
		{name: "16 digits", in: `1234567890123456`, bad: true},
		{name: "upper key", in: `"a";Q=1`, bad: true},
		{name: "missing comma", in: `"a" "b"`, bad: true},
		{name: "control byte", in: "\"a\x01\"", bad: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := parseSFList(tt.in)
			if tt.bad {
				if err == nil {
					t.Fatalf("parseSFList(%q) = %v, want error", tt.in, got)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tt.want) {
				t.Fatalf("parseSFList(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

// mustSFList parses a List or fails the test.
func mustSFList(t testing.TB, s string) []sfItem {
	t.Helper()
	l, err := parseSFList(s)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// errIs reports whether err matches want, where a nil want means no error.
func errIs(err, want error) bool {
	if want == nil {
		return err == nil
	}
	return errors.Is(err, want)
}
