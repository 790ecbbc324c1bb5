package checkapi

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/tollgate/tollgate/guard"
)

func TestDecodeCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		body string
		want guard.Request
		peek bool
		bad  string // substring of the error; "" for success
	}{
		{name: "full", body: `{"api_key":"sk_1","endpoint":"/v1/x","method":"POST","cost":3,"tenant":"acme","ip":"192.0.2.1"}`,
			want: guard.Request{Key: "sk_1", Path: "/v1/x", Method: "POST", Cost: 3, Tenant: "acme", IP: netip.MustParseAddr("192.0.2.1")}},
		{name: "cost omitted is 1", body: `{"api_key":"sk_1"}`, want: guard.Request{Key: "sk_1", Cost: 1}},
		{name: "cost 0 is a peek", body: `{"api_key":"sk_1","cost":0}`, want: guard.Request{Key: "sk_1"}, peek: true},
		{name: "mapped IPv4 unmapped", body: `{"ip":"::ffff:10.1.2.3"}`, want: guard.Request{Cost: 1, IP: netip.MustParseAddr("10.1.2.3")}},
		{name: "whitespace around", body: " \n{\"api_key\":\"k\"}\n ", want: guard.Request{Key: "k", Cost: 1}},
		{name: "unknown field", body: `{"api_kye":"k"}`, bad: `unknown field "api_kye"`},
		{name: "zone in ip", body: `{"ip":"fe80::1%eth0"}`, bad: "ip"},
		{name: "cost float", body: `{"cost":2.5}`, bad: `"cost"`},
		{name: "cost huge", body: `{"cost":1e40}`, bad: `"cost"`},
		{name: "cost negative", body: `{"cost":-3}`, bad: "negative"},
		{name: "array", body: `[]`, bad: "object"},
		{name: "two objects", body: `{}{}`, bad: "after"},
		{name: "truncated", body: `{"api_key":"k"`, bad: "JSON"},
		{name: "long tenant", body: `{"tenant":"` + strings.Repeat("t", 200) + `"}`, bad: "tenant"},
		// Keys are kept byte for byte: invalid UTF-8 and lone surrogates are
		// not folded into U+FFFD (the guard refuses them, INVALID_KEY).
		{name: "escapes", body: `{"api_key":"a\"\\\/\b\f\n\r\t\u00e9\ud83d\ude00"}`, want: guard.Request{Key: "a\"\\/\b\f\n\r\té😀", Cost: 1}},
		{name: "invalid UTF-8 key kept", body: "{\"api_key\":\"k\xff\"}", want: guard.Request{Key: "k\xff", Cost: 1}},
		{name: "lone surrogate key kept", body: `{"api_key":"k\ud800"}`, want: guard.Request{Key: "k\xed\xa0\x80", Cost: 1}},
		{name: "lone low surrogate", body: `{"api_key":"k\udc00x"}`, want: guard.Request{Key: "k\xed\xb0\x80x", Cost: 1}},
		{name: "high then not low", body: `{"api_key":"\ud800\u0041"}`, want: guard.Request{Key: "\xed\xa0\x80A", Cost: 1}},
		{name: "null key", body: `{"api_key":null}`, want: guard.Request{Cost: 1}},
		{name: "key not a string", body: `{"api_key":7}`, bad: `field "api_key" must be a string`},
		{name: "endpoint invalid UTF-8", body: "{\"endpoint\":\"/\xff\"}", bad: "endpoint"},
		{name: "endpoint lone surrogate", body: `{"endpoint":"/\ud800"}`, bad: "endpoint"},
		{name: "tenant invalid UTF-8", body: "{\"tenant\":\"a\xfe\"}", bad: "tenant"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req, peek, err := decodeCheck([]byte(tt.body))
			if tt.bad != "" {
				var eb *errBody
				if err == nil || !errors.As(err, &eb) || !strings.Contains(err.Error(), tt.bad) {
					t.Fatalf("error %v, want one mentioning %q", err, tt.bad)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if peek != tt.peek || req.Key != tt.want.Key || req.Path != tt.want.Path || req.Method != tt.want.Method ||
				req.Cost != tt.want.Cost || req.Tenant != tt.want.Tenant || req.IP != tt.want.IP {
				t.Fatalf("got %+v peek %v, want %+v peek %v", req, peek, tt.want, tt.peek)
			}
		})
	}
}

func TestDecodeBatch(t *testing.T) {
	t.Parallel()
	items, err := decodeBatch([]byte(`[{"api_key":"a"}, {"x":1}, 3]`), 3)
	if err != nil || len(items) != 3 {
		t.Fatalf("%d items, %v", len(items), err)
	}
	if _, err := decodeBatch([]byte(`[{},{},{},{}]`), 3); !errors.Is(err, errTooLarge) {
		t.Fatalf("4 of 3: %v", err)
	}
	if items, err := decodeBatch([]byte(`[]`), 3); err != nil || len(items) != 0 {
		t.Fatalf("empty: %v %v", items, err)
	}
	for _, bad := range []string{`{}`, `[{}`, `[{}] x`, `[{},]`, ``} {
		if _, err := decodeBatch([]byte(bad), 3); err == nil {
			t.Errorf("decodeBatch(%q) accepted", bad)
		}
	}
}

// FuzzCheckBody: the check body decoder never panics, errors never echo
// the key, and what it accepts survives a round trip.
func FuzzCheckBody(f *testing.F) {
	for _, s := range []string{
		`{"api_key":"sk_1","endpoint":"/v1/x","method":"GET","cost":3,"tenant":"acme","ip":"2001:db8::1"}`,
		`{"cost":0}`, `{"ip":"::ffff:1.2.3.4"}`, `{"api_key":"\u0001"}`, `{`, `[]`, `null`, `{"cost":-1}`,
		`{"api_key":"a","api_key":"b"}`, `{"endpoint":"/\ud800"}`, `{"unknown":1}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		req, peek, err := decodeCheck(data)
		if err != nil {
			var eb *errBody
			if !errors.As(err, &eb) {
				t.Fatalf("error of an unexpected type %T: %v", err, err)
			}
			return
		}
		if peek != (req.Cost == 0) || req.Cost < 0 {
			t.Fatalf("cost %d, peek %v", req.Cost, peek)
		}
		if req.IP.IsValid() && (req.IP.Is4In6() || req.IP.Zone() != "") {
			t.Fatalf("ip %v not normalised", req.IP)
		}
		if !utf8.ValidString(req.Key) {
			// Kept byte for byte, never folded into U+FFFD: the guard
			// refuses it (INVALID_KEY). JSON cannot carry it back.
			if guard.ValidKey(req.Key) {
				t.Fatalf("key %q is invalid UTF-8 yet valid", req.Key)
			}
			return
		}
		b := checkBody{APIKey: exactString(req.Key), Endpoint: exactString(req.Path), Method: req.Method, Tenant: exactString(req.Tenant)}
		cost := req.Cost
		b.Cost = &cost
		if req.IP.IsValid() {
			b.IP = req.IP.String()
		}
		enc, err := json.Marshal(&b)
		if err != nil {
			t.Fatal(err)
		}
		req2, peek2, err := decodeCheck(enc)
		if err != nil || peek2 != peek || req2.Key != req.Key || req2.Path != req.Path || req2.Method != req.Method ||
			req2.Tenant != req.Tenant || req2.IP != req.IP || req2.Cost != req.Cost {
			t.Fatalf("round trip of %s: %+v %v %v, want %+v", enc, req2, peek2, err, req)
		}
	})
}
