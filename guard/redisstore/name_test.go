package redisstore_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/tollgate/tollgate/guard"
	"github.com/tollgate/tollgate/guard/keyid"
	"github.com/tollgate/tollgate/guard/redisstore"
	"github.com/tollgate/tollgate/guard/rules"
)

// hashTag returns what Redis Cluster hashes: the part between the first '{'
// and the next '}'.
func hashTag(name string) string {
	i := strings.IndexByte(name, '{')
	j := strings.IndexByte(name[i+1:], '}')
	return name[i+1 : i+1+j]
}

// namer returns a store that only names counters (it never reaches Redis).
func namer(tb testing.TB) *redisstore.Store {
	s := redisstore.New(nil, redisstore.WithBatch(1, 0))
	tb.Cleanup(func() { s.Close() })
	return s
}

func keyIDs(tb testing.TB) *keyid.Hasher {
	h, err := keyid.New([]byte("test-secret-0123456789"))
	if err != nil {
		tb.Fatal(err)
	}
	return h
}

// keyCounter and tenantCounter are the identities the guard gives a key's
// key- and tenant-scope counters (a key without a tenant is its own).
func keyCounter(tag, kid, tenant string) *guard.CounterID {
	if tenant == "" {
		tenant = kid
	}
	return &guard.CounterID{Rule: tag, Scope: rules.ScopeKey, Tenant: tenant, KeyID: kid}
}

func tenantCounter(tag, kid, tenant string) *guard.CounterID {
	if tenant == "" {
		tenant = kid
	}
	return &guard.CounterID{Rule: tag, Scope: rules.ScopeTenant, Tenant: tenant}
}

// FuzzCounterName: whatever the tenant (from a registry or a trusted
// header) or key holds, a counter name has exactly the intended hash tag,
// the key and tenant counters of a request share it, and two different
// tenants never share a name.
func FuzzCounterName(f *testing.F) {
	for _, s := range []string{"acme", "{x}", "a}b", "ip:1.2.3.4", "g:abc", "~x", "*", "", "k:{t}*"} {
		f.Add(s, s+"2", "sk_{live}*:1")
	}
	s, h := namer(f), keyIDs(f)
	f.Fuzz(func(t *testing.T, tenant1, tenant2, key string) {
		kid := h.ID(key)
		kn := s.CounterName(keyCounter("abc", kid, tenant1))
		tn := s.CounterName(tenantCounter("def", kid, tenant1))
		if strings.Count(kn, "{") != 1 || strings.Count(kn, "}") != 1 {
			t.Fatalf("name %q has stray braces", kn)
		}
		if hashTag(kn) != hashTag(tn) {
			t.Fatalf("key and tenant counters in different slots: %q %q", kn, tn)
		}
		// A key without a tenant is its own tenant: its tag is the key_id.
		if tenant1 == "" && hashTag(kn) != kid {
			t.Fatalf("key %q: tag of %q is not its key_id", key, kn)
		}
		t1, t2 := tenant1, tenant2
		if t1 == "" {
			t1 = kid
		}
		if t2 == "" {
			t2 = kid
		}
		if t1 != t2 && s.CounterName(tenantCounter("def", kid, tenant2)) == tn {
			t.Fatalf("tenants %q and %q share counter %q", tenant1, tenant2, tn)
		}
	})
}

func TestCounterNames(t *testing.T) {
	t.Parallel()
	s, h := namer(t), keyIDs(t)
	kid := h.ID("sk_test_1")
	for _, tc := range []struct {
		name string
		id   *guard.CounterID
		want string
	}{
		{"key without tenant", keyCounter("abc", kid, ""), "tg{" + kid + "}abc"},
		{"key with tenant", keyCounter("abc", kid, "acme"), "tg{acme}abc" + kid},
		{"tenant", tenantCounter("xyz", kid, "acme"), "tg{acme}xyz"},
		{"ipv4", &guard.CounterID{Rule: "ip1", Scope: rules.ScopeIP, IP: netip.MustParseAddr("::ffff:10.0.0.7")}, "tg{ip:10.0.0.7}ip1"},
		{"ipv6 /64", &guard.CounterID{Rule: "ip1", Scope: rules.ScopeIP, IP: netip.MustParseAddr("2001:db8:1:2:aaaa::1")}, "tg{ip:2001:db8:1:2::/64}ip1"},
		{"global", &guard.CounterID{Rule: "glb", Scope: rules.ScopeGlobal}, "tg{g:glb}glb"},
		{"by endpoint", &guard.CounterID{Rule: "glb", Scope: rules.ScopeGlobal, Endpoint: "/v1/x"}, ""},
		{"unsafe tenant is hashed", tenantCounter("xyz", kid, "a}b"), ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := s.CounterName(tc.id)
			switch {
			case tc.id.Endpoint != "":
				if !strings.HasPrefix(got, "tg{g:glb}glb:") || len(got) != len("tg{g:glb}glb:")+11 {
					t.Fatalf("got %q", got)
				}
			case tc.want == "":
				if !strings.HasPrefix(got, "tg{~") || strings.Count(got, "}") != 1 {
					t.Fatalf("got %q", got)
				}
			case got != tc.want:
				t.Fatalf("got %q, want %q", got, tc.want)
			}
		})
	}
	p := redisstore.New(nil, redisstore.WithBatch(1, 0), redisstore.WithKeyPrefix("rl"))
	defer p.Close()
	if got := p.CounterName(keyCounter("abc", kid, "")); got != "rl{"+kid+"}abc" {
		t.Fatalf("with prefix rl: %q", got)
	}
}

// TestHostileKeyMaterial: API keys and tenants holding the characters that
// matter to Redis key names ({, } end or start a Cluster hash tag, : is the
// separator of the scope prefixes, * is a glob in KEYS/SCAN) can neither
// escape their hash tag nor collide with another key's counter: keys are
// hashed to key_ids, tenants that are not plain are hashed too.
func TestHostileKeyMaterial(t *testing.T) {
	t.Parallel()
	s, h := namer(t), keyIDs(t)
	hostile := []string{
		"a", "b", "a{b}", "{b}", "{", "}", "{}", "}{", "a}b{c", "{{a}}",
		"a:b", "ip:10.0.0.1", "g:abc", "~abc", "*", "a*", "*}", "{*}",
		"tg{acme}abc", "acme", "}abc", "sk_live:{tenant}*:x",
	}
	seen := map[string]string{} // counter name → what produced it
	add := func(name, what string) {
		t.Helper()
		if strings.Count(name, "{") != 1 || strings.Count(name, "}") != 1 || strings.Index(name, "{") > strings.Index(name, "}") {
			t.Fatalf("%s: name %q does not have exactly one hash tag", what, name)
		}
		if prev, ok := seen[name]; ok {
			t.Fatalf("%s and %s share counter %q", what, prev, name)
		}
		seen[name] = what
	}
	for _, key := range hostile {
		kid := h.ID(key)
		kn := s.CounterName(keyCounter("abc", kid, ""))
		if hashTag(kn) != kid {
			t.Fatalf("key %q: tag %q, want its key_id", key, hashTag(kn))
		}
		if len(key) > 4 && strings.Contains(kn, key) {
			t.Fatalf("raw key %q in counter name %q", key, kn)
		}
		add(kn, "key "+key)
		add(s.CounterName(tenantCounter("def", kid, "")), "tenant of key "+key)
		ep := keyCounter("ghi", kid, "")
		ep.Endpoint = "/x"
		add(s.CounterName(ep), "endpoint counter of key "+key)
		// The same string as a tenant (from a registry or a trusted header).
		k := h.ID("k")
		tn := s.CounterName(tenantCounter("def", k, key))
		if tag := hashTag(tn); tag != key && !strings.HasPrefix(tag, "~") {
			t.Fatalf("tenant %q: tag %q is neither the tenant nor its hash", key, tag)
		}
		add(tn, "tenant "+key)
		add(s.CounterName(keyCounter("abc", k, key)), "key k of tenant "+key)
	}
}
