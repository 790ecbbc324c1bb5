package apierror

import (
	"maps"
	"net/http"
	"unicode/utf8"
)

// Escaping says which characters AppendString escapes beyond those JSON
// requires.
type Escaping uint8

const (
	// EscapeJSON escapes what JSON requires (quotation mark, backslash,
	// control characters) and U+2028 and U+2029, so that the text is also
	// valid JavaScript: what encoding/json writes with SetEscapeHTML(false).
	EscapeJSON Escaping = iota
	// EscapeHTML escapes <, > and & as well (\u003c, \u003e, \u0026), so
	// that a browser sniffing the body as HTML finds no markup in it: what
	// encoding/json writes by default.
	EscapeHTML
)

// safeSets[e][c] is whether the ASCII byte c is written as is under e.
var safeSets = [2][utf8.RuneSelf]bool{safeSet(EscapeJSON), safeSet(EscapeHTML)}

func safeSet(e Escaping) [utf8.RuneSelf]bool {
	var s [utf8.RuneSelf]bool
	for c := 0x20; c < utf8.RuneSelf; c++ {
		s[c] = c != '"' && c != '\\' && (e != EscapeHTML || (c != '<' && c != '>' && c != '&'))
	}
	return s
}

const hexDigits = "0123456789abcdef"

// AppendString appends s to b as a JSON string, byte for byte as
// encoding/json writes it (e chooses its SetEscapeHTML): quotation mark,
// backslash and control characters escaped (\b, \f, \n, \r, \t, else
// \u00XX), invalid UTF-8 replaced by \ufffd, U+2028 and U+2029 escaped. It
// takes []byte too, so that text built in a stack buffer needs no string
// copy, and allocates nothing but b's growth.
func AppendString[S string | []byte](b []byte, s S, e Escaping) []byte {
	safe := &safeSets[e&1]
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if safe[c] {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := decodeRune(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// decodeRune is utf8.DecodeRune for a string or a byte slice, without
// converting (and copying) either.
func decodeRune[S string | []byte](s S) (rune, int) {
	var buf [utf8.UTFMax]byte
	n := copy(buf[:], s)
	return utf8.DecodeRune(buf[:n])
}

// AppendFields appends the members every error object starts with,
// `"code":<code>,"message":<msg>`, without braces: for an error object
// with more members ("details", …) or inside another object (a check
// API decision). msg is shown to clients as is: never put an API key in
// it.
func AppendFields[M string | []byte](b []byte, code string, msg M, e Escaping) []byte {
	b = append(b, `"code":`...)
	b = AppendString(b, code, e)
	b = append(b, `,"message":`...)
	return AppendString(b, msg, e)
}

// AppendBody appends the error body {"error":{"code":…,"message":…}}.
func AppendBody[M string | []byte](b []byte, code string, msg M, e Escaping) []byte {
	b = append(b, `{"error":{`...)
	b = AppendFields(b, code, msg, e)
	return append(b, "}}"...)
}

// Write answers an HTTP request with status and the error body, HTML
// escaped and followed by a newline (for curl users), as
// application/json: the operator API's and the usage reports' errors.
// The data plane's errors, which also speak problem+json, are written by
// guard/httpguard (WriteError, WriteDecision) with the same body.
func Write(w http.ResponseWriter, status int, code, msg string) {
	b := make([]byte, 0, 48+len(code)+len(msg))
	b = AppendBody(b, code, msg, EscapeHTML)
	b = append(b, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// Value returns the error body as a value for encoding/json, for an
// answer that carries members beyond code and message ("details",
// "revision", …) and is encoded like the rest of its surface's answers:
// {"error":{"code":code,"message":msg, members…}}. members may be nil; it
// is not modified, and a "code" or "message" in it is overridden.
func Value(code, msg string, members map[string]any) map[string]any {
	obj := make(map[string]any, len(members)+2)
	maps.Copy(obj, members)
	obj["code"], obj["message"] = code, msg
	return map[string]any{"error": obj}
}
