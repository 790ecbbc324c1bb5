package rules

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonAsYAML prepares a JSON document for the YAML parser. JSON is YAML,
// nearly: inside strings the YAML parser refuses the escape `\/` (PHP's
// encoder writes it by default) and UTF-16 surrogate pairs such as
// `\ud83d\ude00` (Python's does), refuses raw characters YAML deems
// unprintable (DEL, C1 controls, U+FFFE, U+FFFF), and folds raw NEL, U+2028
// and U+2029 as line breaks. Valid JSON is rewritten so that its strings
// mean what encoding/json says they mean: `\/` becomes `/`, a surrogate pair
// YAML's `\UXXXXXXXX`, a lone surrogate U+FFFD, and the raw characters above
// escapes. Newlines outside strings are untouched, so line numbers stay
// right. Any other input is returned as is.
func jsonAsYAML(data []byte) []byte {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 || (trimmed[0] != '{' && trimmed[0] != '[') || !json.Valid(data) {
		return data
	}
	out := make([]byte, 0, len(data)+len(data)/8)
	inString := false
	for i := 0; i < len(data); {
		c := data[i]
		if !inString {
			inString = c == '"'
			out = append(out, c)
			i++
			continue
		}
		switch {
		case c == '"':
			inString = false
			out = append(out, c)
			i++
		case c == '\\':
			// json.Valid guarantees a complete escape after the backslash.
			switch data[i+1] {
			case '/':
				out = append(out, '/')
				i += 2
			case 'u':
				r1 := hex4(data[i+2 : i+6])
				if !utf16.IsSurrogate(r1) {
					out = append(out, data[i:i+6]...)
					i += 6
					break
				}
				r, n := utf8.RuneError, 6
				if i+12 <= len(data) && data[i+6] == '\\' && data[i+7] == 'u' {
					if dec := utf16.DecodeRune(r1, hex4(data[i+8:i+12])); dec != utf8.RuneError {
						r, n = dec, 12
					}
				}
				out = fmt.Appendf(out, `\U%08X`, r)
				i += n
			default:
				out = append(out, c, data[i+1])
				i += 2
			}
		case c < utf8.RuneSelf:
			if c == 0x7f {
				out = append(out, `\u007F`...)
			} else {
				out = append(out, c)
			}
			i++
		default:
			r, size := utf8.DecodeRune(data[i:])
			switch {
			case r == utf8.RuneError && size == 1:
				out = append(out, `\uFFFD`...) // as encoding/json decodes invalid UTF-8
			case r <= 0x9f || r == 0x2028 || r == 0x2029 || r == 0xfffe || r == 0xffff:
				out = fmt.Appendf(out, `\u%04X`, r)
			default:
				out = append(out, data[i:i+size]...)
			}
			i += size
		}
	}
	return out
}

func hex4(b []byte) rune {
	n, err := strconv.ParseUint(string(b), 16, 32)
	if err != nil {
		return utf8.RuneError
	}
	return rune(n)
}
