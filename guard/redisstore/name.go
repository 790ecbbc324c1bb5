package redisstore

import (
	"crypto/sha256"
	"encoding/base64"
	"strings"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/rules"
)

var _ guard.Namer = (*Store)(nil)

// CounterName implements guard.Namer: the key prefix, the scope value in a
// Cluster hash tag, then the rule's tag (docs/guard.md, Redis layout):
//
//	key scope:    <prefix>{<tenant>}<tag>[<key_id> if the key has a tenant]
//	tenant scope: <prefix>{<tenant>}<tag>
//	ip scope:     <prefix>{ip:<address or IPv6 /64>}<tag>
//	global scope: <prefix>{g:<tag>}<tag>
//
// followed by ":" and a hash of the normalised endpoint for by_endpoint
// rules. A request's key and tenant counters share the tenant's tag, so one
// script decides both; ip and global counters have tags of their own,
// which Do decides first on Cluster (see doCluster).
func (s *Store) CounterName(id *guard.CounterID) string {
	b := make([]byte, 0, 64)
	b = append(b, s.prefix...)
	b = append(b, '{')
	switch id.Scope {
	case rules.ScopeIP:
		b = append(b, ipTag...)
		b = appendIP(b, id)
	case rules.ScopeGlobal:
		b = append(b, globalTag...)
		b = append(b, id.Rule...)
	default:
		b = appendTenantTag(b, id.Tenant)
	}
	b = append(b, '}')
	b = append(b, id.Rule...)
	if id.Scope == rules.ScopeKey && id.Tenant != id.KeyID {
		b = append(b, id.KeyID...)
	}
	if id.Endpoint != "" {
		sum := sha256.Sum256([]byte(id.Endpoint))
		b = append(b, ':')
		b = base64.RawURLEncoding.AppendEncode(b, sum[:8])
	}
	return string(b)
}

// The hash tag prefixes of ip and global counters. A tenant tag never
// starts with them (':' is not a plain tenant character), which is how
// primary tells a request's own slot from the others.
const (
	ipTag     = "ip:"
	globalTag = "g:"
)

// appendIP appends an ip-scope counter's address: IPv4, or an IPv6 /64
// prefix ("-" for none, which the guard never names: such requests match
// no ip-scope rule).
func appendIP(b []byte, id *guard.CounterID) []byte {
	ip := id.IP
	if !ip.IsValid() {
		return append(b, '-')
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return p.AppendTo(b)
	}
	return ip.AppendTo(b)
}

// appendTenantTag appends the tenant as a hash tag: as is when it is made of
// characters that cannot end a tag or be confused with other scopes, else
// "~" and a hash of it.
func appendTenantTag(b []byte, tenant string) []byte {
	safe := len(tenant) > 0 && len(tenant) <= 64
	for i := 0; safe && i < len(tenant); i++ {
		c := tenant[i]
		safe = c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.'
	}
	if safe {
		return append(b, tenant...)
	}
	sum := sha256.Sum256([]byte(tenant))
	b = append(b, '~')
	return base64.RawURLEncoding.AppendEncode(b, sum[:16])
}

// primary reports whether a counter name is in a request's own slot: its
// hash tag is a tenant's (key and tenant scope), not an IP's or the global
// one's.
func primary(name string) bool {
	i := strings.IndexByte(name, '{')
	if i < 0 {
		return true
	}
	tag := name[i+1:]
	return !strings.HasPrefix(tag, ipTag) && !strings.HasPrefix(tag, globalTag)
}
