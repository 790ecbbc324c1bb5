package rules

// Endpoint normalisation. Two spellings of one resource must never
// be two resources: the endpoint is what rules match and what by_endpoint
// counts, so `//v1/search`, `/v1/./search` and `/v1/%73earch` must be
// `/v1/search` to the limiter, and the upstream must see the same path.

// pathRaw marks the bytes a normal path holds as they are, '/' aside:
// RFC 3986 pchar (unreserved, sub-delims, ':' and '@') and the brackets
// browsers leave alone (as net/url does). Every other byte is
// percent-encoded in a normal path, or refused.
var pathRaw = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "-._~!$&'()*+,;=:@[]" {
		t[c] = true
	}
	return t
}()

// unreserved reports whether c is an RFC 3986 §2.3 unreserved character,
// which a normal path never percent-encodes.
func unreserved(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
		c == '-' || c == '.' || c == '_' || c == '~'
}

// forbiddenEscape reports whether an escaped byte makes a path invalid: an
// encoded slash, backslash or NUL would let one resource be named by two
// paths (or reach another one upstream), so such paths are refused.
func forbiddenEscape(c byte) bool { return c == '/' || c == '\\' || c == 0 }

const upperHex = "0123456789ABCDEF"

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10, true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// CleanPath returns the normal form of a request path, the form
// proxies forward and rules see, and ok false for a path that must be
// refused with 400 INVALID_PATH.
//
// path is the path as sent on the wire: percent-encoded (for net/http, the
// request's URL.EscapedPath()). A query string, from the first '?', is
// dropped. Then, in Envoy's normalize_path and merge_slashes order:
//
//  1. percent-encoded unreserved characters (RFC 3986 §2.3: letters,
//     digits, '-', '.', '_', '~') are decoded; other escapes are kept, with
//     upper-case hex digits (§6.2.2.1); bytes that may not appear raw in a
//     path (space, '"', '<', non-ASCII, ...) are percent-encoded;
//  2. "." and ".." segments are removed (§5.2.4);
//  3. runs of slashes are merged into one.
//
// A trailing slash is kept ("/v1/search/" stays so; [Ruleset.Normalize]
// drops it for matching and counters). The empty path stays empty (a check
// without an endpoint). Refused (ok false): a non-empty path that does not
// start with '/', one that ".." would take above the root ("/..", "/a/../.."),
// one holding an encoded slash, backslash or NUL ("%2F", "%5C", "%00", in
// either case), a raw backslash or control character, or a '%' not followed
// by two hex digits.
//
// CleanPath is idempotent, and its result never holds "//", a "." or ".."
// segment, or a forbidden escape. A path that is already normal is returned
// as is without allocating; so is a query-stripped prefix of it.
func CleanPath(path string) (clean string, ok bool) {
	for i := 0; i < len(path); i++ {
		if path[i] == '?' {
			path = path[:i]
			break
		}
	}
	if path == "" {
		return "", true
	}
	if path[0] != '/' {
		return "", false
	}
	if isClean(path) {
		return path, true
	}
	return cleanSlow(path)
}

// isClean reports whether path (starting with '/', no query) is already
// normal; see CleanPath. It is the fast check of the common case.
func isClean(path string) bool {
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c == '/':
			rest := path[i+1:]
			switch {
			case rest == "":
			case rest[0] == '/':
				return false // "//"
			case rest[0] == '.':
				if len(rest) == 1 || rest[1] == '/' {
					return false // "/." segment
				}
				if rest[1] == '.' && (len(rest) == 2 || rest[2] == '/') {
					return false // "/.." segment
				}
			}
		case c == '%':
			if i+2 >= len(path) {
				return false
			}
			h, l := path[i+1], path[i+2]
			hv, ok1 := unhex(h)
			lv, ok2 := unhex(l)
			v := hv<<4 | lv
			// Upper-case hex of a byte that stays escaped, and not one of
			// the refused ones.
			if !ok1 || !ok2 || h >= 'a' || l >= 'a' || unreserved(v) || forbiddenEscape(v) {
				return false
			}
			i += 2
		case !pathRaw[c]:
			return false
		}
	}
	return true
}

// cleanSlow normalises a path that failed isClean.
func cleanSlow(path string) (string, bool) {
	var (
		decBuf, outBuf [256]byte
		dec            = decBuf[:0]
	)
	// 1. Escapes: decode unreserved, refuse the forbidden ones, upper-case
	// the others; encode what may not stand raw.
	for i := 0; i < len(path); i++ {
		c := path[i]
		switch {
		case c == '%':
			if i+2 >= len(path) {
				return "", false
			}
			hv, ok1 := unhex(path[i+1])
			lv, ok2 := unhex(path[i+2])
			if !ok1 || !ok2 {
				return "", false
			}
			v := hv<<4 | lv
			switch {
			case forbiddenEscape(v):
				return "", false
			case unreserved(v):
				dec = append(dec, v)
			default:
				dec = append(dec, '%', upperHex[v>>4], upperHex[v&0xf])
			}
			i += 2
		case c == '/' || pathRaw[c]:
			dec = append(dec, c)
		case c == '\\' || c < 0x20 || c == 0x7f:
			return "", false
		default:
			dec = append(dec, '%', upperHex[c>>4], upperHex[c&0xf])
		}
	}

	// 2. Dot segments (RFC 3986 §5.2.4), segment by segment: out holds
	// "/" + segment for every segment kept (empty ones included), so ".."
	// drops back to the last '/'.
	out := outBuf[:0]
	for i := 0; i < len(dec); {
		j := i + 1
		for j < len(dec) && dec[j] != '/' {
			j++
		}
		seg := dec[i+1 : j]
		last := j == len(dec)
		switch string(seg) {
		case ".":
			if last {
				out = append(out, '/')
			}
		case "..":
			k := lastSlash(out)
			if k < 0 {
				return "", false // above the root
			}
			out = out[:k]
			if last {
				out = append(out, '/')
			}
		default:
			out = append(out, '/')
			out = append(out, seg...)
		}
		i = j
	}
	if len(out) == 0 {
		out = append(out, '/')
	}

	// 3. Merge slashes.
	n := 1
	for i := 1; i < len(out); i++ {
		if out[i] == '/' && out[n-1] == '/' {
			continue
		}
		out[n] = out[i]
		n++
	}
	out = out[:n]
	if string(out) == path {
		return path, true
	}
	return string(out), true
}

func lastSlash(b []byte) int {
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] == '/' {
			return i
		}
	}
	return -1
}

// TrimTrailingSlash drops the trailing slash of a path other than "/": the
// endpoint rules match and by_endpoint counts treats "/v1/search/" as
// "/v1/search", while the forwarded path keeps it.
func TrimTrailingSlash(path string) string {
	if len(path) > 1 && path[len(path)-1] == '/' {
		return path[:len(path)-1]
	}
	return path
}
