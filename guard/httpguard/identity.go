package httpguard

import (
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/internal/httptoken"
)

// Errors of identity extraction. Match them with errors.Is: the errors
// Extract returns wrap them with the source they came from (never the key).
var (
	// ErrInvalidKey: a key from an API-key source (header or query) is
	// one guard.ValidKey refuses (longer than 256 bytes, invalid UTF-8, a
	// space or a control character), longer than Identity.MaxKeyLen, is
	// percent-encoded badly, or is given more than once. Answer 400
	// INVALID_KEY.
	ErrInvalidKey = errors.New("httpguard: invalid API key")
	// ErrInvalidCost: the trusted cost header is not a positive integer.
	// Answer 400 INVALID_REQUEST.
	ErrInvalidCost = errors.New("httpguard: invalid cost")
	// ErrInvalidKeySource: ParseKeySource was given something that is
	// not "bearer", "header:<name>" or "query:<name>".
	ErrInvalidKeySource = errors.New("httpguard: invalid key source")
)

// DefaultMaxKeyLen is the longest key accepted when Identity.MaxKeyLen is
// zero: guard.MaxKeyLen.
const DefaultMaxKeyLen = guard.MaxKeyLen

type sourceKind uint8

const (
	sourceHeader sourceKind = iota + 1
	sourceBearer
	sourceQuery
)

// KeySource is one place an API key may be found. Make one with
// [ParseKeySource]; it also decodes from text (encoding.TextUnmarshaler), so
// configuration can list sources as strings. The zero KeySource names no
// place and is skipped.
type KeySource struct {
	kind sourceKind
	// name is the canonical header name or the query parameter name;
	// spelled is the header name as configured, for String.
	name, spelled string
}

// DefaultKeySources are the sources used when Identity.Sources is empty:
// "header:X-API-Key", then "bearer".
func DefaultKeySources() []KeySource {
	return append([]KeySource(nil), defaultKeySources[:]...)
}

// defaultKeySources backs DefaultKeySources and the zero Identity; never
// modified.
var defaultKeySources = [...]KeySource{{sourceHeader, "X-Api-Key", "X-API-Key"}, {kind: sourceBearer}}

// ParseKeySource parses a key source:
//
//   - "header:<name>": the value of header <name> (e.g. X-API-Key, or a
//     header set by a trusted auth layer such as X-Auth-Key);
//   - "bearer": the token of an "Authorization: Bearer <token>" header;
//   - "query:<name>": the query parameter <name> (e.g. api_key).
//
// "bearer" and the prefixes are case-insensitive. Errors wrap
// ErrInvalidKeySource.
func ParseKeySource(s string) (KeySource, error) {
	kind, name, found := strings.Cut(s, ":")
	switch {
	case !found && strings.EqualFold(s, "bearer"):
		return KeySource{kind: sourceBearer}, nil
	case found && strings.EqualFold(kind, "header"):
		if !httptoken.Is(name) {
			return KeySource{}, fmt.Errorf("%w %q: %q is not a header name", ErrInvalidKeySource, s, name)
		}
		return KeySource{sourceHeader, textproto.CanonicalMIMEHeaderKey(name), name}, nil
	case found && strings.EqualFold(kind, "query"):
		if name == "" || strings.ContainsAny(name, "&=#;") || !isVisibleASCII(name) {
			return KeySource{}, fmt.Errorf("%w %q: %q is not a query parameter name", ErrInvalidKeySource, s, name)
		}
		return KeySource{kind: sourceQuery, name: name}, nil
	}
	return KeySource{}, fmt.Errorf(`%w %q: want "bearer", "header:<name>" or "query:<name>"`, ErrInvalidKeySource, s)
}

// String returns the source in the form ParseKeySource accepts.
func (s KeySource) String() string {
	switch s.kind {
	case sourceHeader:
		return "header:" + s.spelled
	case sourceBearer:
		return "bearer"
	case sourceQuery:
		return "query:" + s.name
	}
	return ""
}

// MarshalText implements encoding.TextMarshaler.
func (s KeySource) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler with ParseKeySource.
func (s *KeySource) UnmarshalText(b []byte) error {
	ks, err := ParseKeySource(string(b))
	if err != nil {
		return err
	}
	*s = ks
	return nil
}

// Identity says how a request's identity is read. The zero Identity is
// ready to use: keys from DefaultKeySources, no trusted proxies (the client
// IP is the socket peer and no identity headers are honoured). An Identity
// is safe for concurrent use once configured; do not change it afterwards.
type Identity struct {
	// Sources are tried in order; the first present one gives the key.
	// Default: DefaultKeySources.
	Sources []KeySource
	// TrustedProxies are the CIDRs of proxies whose X-Forwarded-For,
	// TenantHeader, TierHeader and CostHeader are believed. IPv4 ranges
	// match IPv4 and IPv4-mapped IPv6 peers alike. Default: none.
	TrustedProxies []netip.Prefix
	// TenantHeader and TierHeader name headers a trusted auth layer sets.
	// Default: none (tenant and tier come from the key registry).
	TenantHeader, TierHeader string
	// CostHeader names a header carrying the request's cost, a positive
	// integer. Default: none (cost 1 unless a rule sets one).
	CostHeader string
	// MaxKeyLen is the longest key in bytes, at most guard.MaxKeyLen
	// (which the guard enforces whatever this says). Default (0):
	// DefaultMaxKeyLen.
	MaxKeyLen int
}

// Extract reads r's identity into req:
//
//   - req.Key from the first present source (an empty value is absent).
//     Keys are judged by guard.ValidKey, as on every other surface: valid
//     UTF-8 without spaces or control characters, at most MaxKeyLen bytes.
//     A bearer token that is not a valid key (longer than MaxKeyLen, as a
//     JWT would be) falls through to the next source. A header or query
//     key that is invalid, or given more than once, is an error wrapping
//     ErrInvalidKey (400 INVALID_KEY). No key from any source leaves
//     req.Key empty: an anonymous request.
//   - req.IP: the socket peer (r.RemoteAddr), IPv4-mapped addresses
//     unmapped and zones dropped; when the peer is a trusted proxy, the
//     first X-Forwarded-For hop from the right (all header lines, in order)
//     that is not a trusted proxy. A malformed hop stops the walk at the
//     last good address (a trusted proxy, or the peer); when every hop is
//     trusted the leftmost counts. Hops may carry a port ("192.0.2.1:443",
//     "[2001:db8::1]:443"). A peer that is not an IP (a Unix socket) leaves
//     req.IP invalid.
//   - req.Tenant, req.Tier from TenantHeader and TierHeader, and req.Cost
//     from CostHeader, only when the peer is a trusted proxy; otherwise they
//     are cleared. A cost that is not a positive integer is an error
//     wrapping ErrInvalidCost (400 INVALID_REQUEST).
//   - req.Path = r.URL.EscapedPath(), the path as sent (percent-encoded),
//     which the guard normalises (rules.CleanPath); req.Method = r.Method.
//
// req.Domain and req.Descriptor are left alone. A nil *Identity acts as the
// zero Identity.
func (id *Identity) Extract(r *http.Request, req *guard.Request) error {
	if id == nil {
		id = &Identity{}
	}
	peer := peerAddr(r.RemoteAddr)
	trusted := id.trusted(peer)

	req.IP = peer
	req.Tenant, req.Tier, req.Cost = "", "", 0
	req.Method = r.Method
	req.Path = ""
	if r.URL != nil {
		// The escaped form: %2F must stay distinguishable from '/'.
		req.Path = r.URL.EscapedPath()
	}

	if trusted {
		req.IP = id.forwardedFor(r.Header["X-Forwarded-For"], peer)
		if id.TenantHeader != "" {
			req.Tenant = r.Header.Get(id.TenantHeader)
		}
		if id.TierHeader != "" {
			req.Tier = r.Header.Get(id.TierHeader)
		}
	}

	key, err := id.key(r)
	req.Key = key
	if err != nil {
		return err
	}

	if trusted && id.CostHeader != "" {
		if v := r.Header.Get(id.CostHeader); v != "" {
			c, err := strconv.ParseInt(v, 10, 64)
			if err != nil || c < 1 || v[0] == '+' {
				return fmt.Errorf("%w: header %s is not a positive integer", ErrInvalidCost, id.CostHeader)
			}
			req.Cost = c
		}
	}
	return nil
}

// Direct reports whether r's socket peer is the client itself: a valid IP
// that is not a trusted proxy. Behind a trusted proxy the connection is
// shared with other clients, so a penalty must not close it; when the peer
// is not an IP at all (a Unix socket) nobody can tell, and Direct is false.
// A nil *Identity acts as the zero Identity.
func (id *Identity) Direct(r *http.Request) bool {
	peer := peerAddr(r.RemoteAddr)
	if id == nil {
		return peer.IsValid()
	}
	return peer.IsValid() && !id.trusted(peer)
}

// Trusted reports whether r's socket peer is one of TrustedProxies: a
// caller whose X-Forwarded-For and identity headers Extract believes. A
// forward-auth endpoint also takes it as proof that the caller is the proxy
// it was configured for. A nil *Identity trusts nobody.
func (id *Identity) Trusted(r *http.Request) bool {
	return id != nil && id.trusted(peerAddr(r.RemoteAddr))
}

// TrustedAddr reports whether a is one of TrustedProxies (an IPv4-mapped
// address as its IPv4 form), as Trusted does for a request's peer. A nil
// *Identity trusts nobody.
func (id *Identity) TrustedAddr(a netip.Addr) bool {
	return id != nil && id.trusted(normalizeAddr(a))
}

// WriteIdentityError answers a request whose identity Extract refused:
// 400 INVALID_KEY for an error wrapping ErrInvalidKey, else 400
// INVALID_REQUEST (a cost header that is not a positive integer), written
// by WriteError. The message never quotes the key.
func WriteIdentityError(w http.ResponseWriter, r *http.Request, err error) {
	code, msg := identityRefusal(err)
	WriteError(w, r, http.StatusBadRequest, code, msg)
}

// identityRefusal is the API error code and message of an Extract error.
func identityRefusal(err error) (code, msg string) {
	if errors.Is(err, ErrInvalidKey) {
		return apierror.InvalidKey, "The API key is malformed."
	}
	return apierror.InvalidRequest, "The request's cost is not a positive integer."
}

func (id *Identity) maxKeyLen() int {
	if id.MaxKeyLen > 0 {
		return id.MaxKeyLen
	}
	return DefaultMaxKeyLen
}

// key returns the key of the first present source.
func (id *Identity) key(r *http.Request) (string, error) {
	maxLen := id.maxKeyLen()
	sources := id.Sources
	if len(sources) == 0 {
		sources = defaultKeySources[:]
	}
	for _, src := range sources {
		var (
			v   string
			why string
		)
		switch src.kind {
		case sourceHeader:
			vals := r.Header[src.name]
			switch {
			case len(vals) == 0 || (len(vals) == 1 && vals[0] == ""):
				continue
			case len(vals) > 1:
				why = whyKeyTwice
			default:
				v = vals[0]
				why = checkKey(v, maxLen)
			}
		case sourceBearer:
			v = bearerToken(r.Header.Get("Authorization"))
			if v == "" || checkKey(v, maxLen) != "" {
				continue // say a JWT: not a key, maybe the next source has one
			}
		case sourceQuery:
			if r.URL == nil {
				continue
			}
			v, why = queryValue(r.URL.RawQuery, src.name)
			if why == "" && v == "" {
				continue
			}
			if why == "" {
				why = checkKey(v, maxLen)
			}
		default:
			continue
		}
		if why != "" {
			return "", fmt.Errorf("%w: %s %s", ErrInvalidKey, src, why)
		}
		return v, nil
	}
	return "", nil
}

// Why a key is invalid, for error messages that must not quote the key.
const (
	whyKeyLength = "is too long"
	whyKeyBytes  = "is not valid UTF-8 or holds a space or control character"
	whyKeyTwice  = "is given more than once"
	whyKeyEscape = "is badly percent-encoded"
)

// checkKey checks a key's length and content with guard.ValidKey, the rule
// of every surface, and returns why it is invalid, or "".
func checkKey(k string, maxLen int) string {
	if len(k) > maxLen || len(k) > guard.MaxKeyLen {
		return whyKeyLength
	}
	if !guard.ValidKey(k) {
		return whyKeyBytes
	}
	return ""
}

func isVisibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return false
		}
	}
	return true
}

// bearerToken returns the token of an "Authorization: Bearer <token>"
// value (scheme case-insensitive), or "".
func bearerToken(v string) string {
	const scheme = "bearer"
	if len(v) <= len(scheme) || !strings.EqualFold(v[:len(scheme)], scheme) || v[len(scheme)] != ' ' {
		return ""
	}
	return strings.TrimLeft(v[len(scheme):], " ")
}

// queryValue returns the unescaped value of parameter name in a raw query
// ("" when absent), or why it cannot be used: given twice or badly
// escaped. Unlike url.ParseQuery it builds no map.
func queryValue(raw, name string) (val, why string) {
	found := false
	for raw != "" {
		var pair string
		pair, raw, _ = strings.Cut(raw, "&")
		k, v, _ := strings.Cut(pair, "=")
		if k != name {
			if !strings.ContainsAny(k, "%+") {
				continue
			}
			uk, err := url.QueryUnescape(k)
			if err != nil || uk != name {
				continue
			}
		}
		if found {
			return "", whyKeyTwice
		}
		found = true
		uv, err := url.QueryUnescape(v)
		if err != nil {
			return "", whyKeyEscape
		}
		val = uv
	}
	return val, ""
}

// peerAddr parses a RemoteAddr ("ip:port", or a bare IP) into an unmapped
// address without zone; invalid when it is neither.
func peerAddr(remote string) netip.Addr {
	if ap, err := netip.ParseAddrPort(remote); err == nil {
		return normalizeAddr(ap.Addr())
	}
	if a, err := netip.ParseAddr(remote); err == nil {
		return normalizeAddr(a)
	}
	return netip.Addr{}
}

func normalizeAddr(a netip.Addr) netip.Addr {
	return a.Unmap().WithZone("")
}

// parseHop parses one X-Forwarded-For element: an IP, optionally with a
// port ("192.0.2.1:80", "[2001:db8::1]:80") or in brackets.
func parseHop(s string) (netip.Addr, bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		return normalizeAddr(a), true
	}
	if ap, err := netip.ParseAddrPort(s); err == nil {
		return normalizeAddr(ap.Addr()), true
	}
	if len(s) > 2 && s[0] == '[' && s[len(s)-1] == ']' {
		if a, err := netip.ParseAddr(s[1 : len(s)-1]); err == nil && a.Is6() {
			return normalizeAddr(a), true
		}
	}
	return netip.Addr{}, false
}

// trusted reports whether a is within TrustedProxies.
func (id *Identity) trusted(a netip.Addr) bool {
	if !a.IsValid() {
		return false
	}
	for _, p := range id.TrustedProxies {
		if p.Contains(a) {
			return true
		}
		// A prefix written as IPv4-mapped IPv6 (::ffff:10.0.0.0/104)
		// still matches the unmapped peer.
		if a.Is4() && p.Addr().Is4In6() && p.Contains(netip.AddrFrom16(a.As16())) {
			return true
		}
	}
	return false
}

// forwardedFor walks X-Forwarded-For from the right (last header line
// first) and returns the first hop that is not a trusted proxy; see
// Extract.
func (id *Identity) forwardedFor(lines []string, peer netip.Addr) netip.Addr {
	last := peer
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for {
			j := strings.LastIndexByte(line, ',')
			hop := trimOWS(line[j+1:])
			if hop != "" { // empty list elements are ignored (RFC 9110 §5.6.1)
				a, ok := parseHop(hop)
				if !ok {
					return last
				}
				if !id.trusted(a) {
					return a
				}
				last = a
			}
			if j < 0 {
				break
			}
			line = line[:j]
		}
	}
	return last
}
