package checkapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"reflect"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/internal/httptoken"
)

// Limits of check body fields other than the key (whose limit is the
// guard's: guard.MaxKeyLen, answered 400 INVALID_KEY).
const (
	maxEndpointLen = 2048
	maxMethodLen   = 32
	maxTenantLen   = 128
)

// errBody is the error of a body that cannot be decided: 400
// INVALID_REQUEST. Its message is safe to show: it never quotes the key.
type errBody struct{ msg string }

func (e *errBody) Error() string { return e.msg }

func bodyErrorf(format string, args ...any) error {
	return &errBody{msg: fmt.Sprintf(format, args...)}
}

// checkBody is the body of POST /v1/check and /v1/report and an item of
// /v1/check/batch.
type checkBody struct {
	APIKey   exactString `json:"api_key"`
	Endpoint exactString `json:"endpoint"`
	Method   string      `json:"method"`
	// Cost is nil when absent (cost 1); a present 0 asks for a peek.
	Cost   *int64      `json:"cost"`
	Tenant exactString `json:"tenant"`
	IP     string      `json:"ip"`
}

// exactString is a JSON string decoded byte for byte. encoding/json
// replaces invalid UTF-8 and lone surrogate escapes with U+FFFD, so two
// distinct keys ("k\xff" and "k\xfe", or "k\ud800" and "k\ud801") would
// decode to one; exactString keeps the bytes as sent (a lone surrogate as
// its 3-byte WTF-8 form), so that the guard sees invalid UTF-8 and refuses
// the key (400 INVALID_KEY) like every other surface, and the field checks
// refuse such endpoints and tenants.
type exactString string

// UnmarshalJSON implements json.Unmarshaler. data is a syntactically valid
// JSON value (the decoder checked it).
func (s *exactString) UnmarshalJSON(data []byte) error {
	if string(data) == "null" {
		return nil
	}
	if len(data) < 2 || data[0] != '"' {
		kind := "number"
		switch data[0] {
		case '{':
			kind = "object"
		case '[':
			kind = "array"
		case 't', 'f':
			kind = "bool"
		}
		return &json.UnmarshalTypeError{Value: kind, Type: reflect.TypeFor[string]()}
	}
	*s = exactString(decodeString(data[1 : len(data)-1]))
	return nil
}

// decodeString decodes the inside of a valid JSON string literal, keeping
// every byte that is not an escape as it is.
func decodeString(b []byte) string {
	if bytes.IndexByte(b, '\\') < 0 {
		return string(b)
	}
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		c := b[i]
		if c != '\\' {
			out = append(out, c)
			continue
		}
		i++
		switch b[i] {
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			r := hex4(b[i+1 : i+5])
			i += 4
			if utf16.IsSurrogate(r) && r < 0xdc00 && i+6 < len(b) && b[i+1] == '\\' && b[i+2] == 'u' {
				if lo := hex4(b[i+3 : i+7]); lo >= 0xdc00 && lo <= 0xdfff {
					out = utf8.AppendRune(out, utf16.DecodeRune(r, lo))
					i += 6
					continue
				}
			}
			if utf16.IsSurrogate(r) {
				// WTF-8: not valid UTF-8, so never a valid key.
				out = append(out, 0xe0|byte(r>>12), 0x80|byte(r>>6)&0x3f, 0x80|byte(r)&0x3f)
				continue
			}
			out = utf8.AppendRune(out, r)
		default: // '"', '\\', '/'
			out = append(out, b[i])
		}
	}
	return string(out)
}

// hex4 parses four hex digits (checked valid by the JSON decoder).
func hex4(b []byte) rune {
	var r rune
	for _, c := range b[:4] {
		r <<= 4
		switch {
		case c >= '0' && c <= '9':
			r |= rune(c - '0')
		case c >= 'a' && c <= 'f':
			r |= rune(c - 'a' + 10)
		case c >= 'A' && c <= 'F':
			r |= rune(c - 'A' + 10)
		}
	}
	return r
}

// decodeCheck decodes one check body strictly: a JSON object with only the
// documented fields, nothing after it. The returned request's Cost is 0 for
// a peek (peek true), else at least 1.
func decodeCheck(data []byte) (req guard.Request, peek bool, err error) {
	var b checkBody
	if fastBody(data, &b) {
		return b.request()
	}
	return decodeStrict(data)
}

// decodeStrict is decodeCheck through encoding/json: every body, with the
// error messages.
func decodeStrict(data []byte) (req guard.Request, peek bool, err error) {
	var b checkBody
	if !startsWith(data, '{') {
		return req, false, bodyErrorf("the body must be a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&b); err != nil {
		return req, false, jsonError(err)
	}
	if err := expectEOF(dec); err != nil {
		return req, false, err
	}
	return b.request()
}

// request validates b and turns it into a guard request.
func (b *checkBody) request() (req guard.Request, peek bool, err error) {
	// The key is checked by the guard (400 INVALID_KEY, like the proxy),
	// so a bad key is a decision, not a malformed body.
	req.Key = string(b.APIKey)
	endpoint, tenant := string(b.Endpoint), string(b.Tenant)
	switch {
	case len(endpoint) > maxEndpointLen:
		return req, false, bodyErrorf("endpoint is longer than %d bytes", maxEndpointLen)
	case !printable(endpoint):
		return req, false, bodyErrorf("endpoint is not valid UTF-8 or holds control characters")
	case len(b.Method) > maxMethodLen || !token(b.Method):
		return req, false, bodyErrorf("method is not an HTTP method token")
	case len(tenant) > maxTenantLen:
		return req, false, bodyErrorf("tenant is longer than %d bytes", maxTenantLen)
	case !printable(tenant):
		return req, false, bodyErrorf("tenant is not valid UTF-8 or holds control characters")
	}
	// The endpoint is normalised by the guard (400 INVALID_PATH when it
	// cannot be), as the proxy's path and Envoy's are.
	req.Path, req.Method, req.Tenant = endpoint, b.Method, tenant
	if b.IP != "" {
		ip, err := netip.ParseAddr(b.IP)
		if err != nil || ip.Zone() != "" {
			return req, false, bodyErrorf("ip is not an IPv4 or IPv6 address")
		}
		req.IP = ip.Unmap()
	}
	switch {
	case b.Cost == nil:
		req.Cost = 1
	case *b.Cost < 0:
		return req, false, bodyErrorf("cost must not be negative")
	case *b.Cost == 0:
		peek = true
	default:
		req.Cost = *b.Cost
	}
	return req, peek, nil
}

// decodeBatch splits a batch body into its items, undecoded. It fails on a
// body that is not a JSON array, and with errTooLarge when the array has
// more than maxItems items.
func decodeBatch(data []byte, maxItems int) ([]json.RawMessage, error) {
	if !startsWith(data, '[') {
		return nil, bodyErrorf("the body must be a JSON array of check bodies")
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if _, err := dec.Token(); err != nil { // [
		return nil, jsonError(err)
	}
	var items []json.RawMessage
	for dec.More() {
		if len(items) == maxItems {
			return nil, errTooLarge
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, jsonError(err)
		}
		items = append(items, raw)
	}
	if _, err := dec.Token(); err != nil { // ]
		return nil, jsonError(err)
	}
	if err := expectEOF(dec); err != nil {
		return nil, err
	}
	return items, nil
}

var errTooLarge = errors.New("checkapi: batch too large")

func startsWith(data []byte, c byte) bool {
	data = bytes.TrimLeft(data, " \t\r\n")
	return len(data) > 0 && data[0] == c
}

func expectEOF(dec *json.Decoder) error {
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return bodyErrorf("unexpected data after the JSON value")
	}
	return nil
}

// jsonError turns a decoding error into a message that names the problem
// and the field, never the value (it could be a key).
func jsonError(err error) error {
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return bodyErrorf("malformed JSON at byte %d", syn.Offset)
	case errors.As(err, &typ):
		if typ.Field != "" {
			return bodyErrorf("field %q must be a %s", typ.Field, kindName(typ.Field))
		}
		return bodyErrorf("unexpected JSON %s", typ.Value)
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return bodyErrorf("truncated JSON")
	}
	// DisallowUnknownFields: `json: unknown field "x"`. The field name is
	// the client's own text; quote it safely and shortly.
	const prefix = "json: unknown field "
	if msg := err.Error(); len(msg) > len(prefix) && msg[:len(prefix)] == prefix {
		name := msg[len(prefix):]
		if len(name) > 66 || !utf8.ValidString(name) {
			name = "(long or invalid)"
		}
		return bodyErrorf("unknown field %s; the fields are api_key, endpoint, method, cost, tenant, ip", name)
	}
	return bodyErrorf("invalid JSON")
}

func kindName(field string) string {
	if field == "cost" {
		return "non-negative integer"
	}
	return "string"
}

// printable reports whether s is valid UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) {
			return false
		}
	}
	return true
}

// token reports whether s is empty or an RFC 9110 token.
func token(s string) bool { return s == "" || httptoken.Is(s) }
