package aggregator

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/tollgate/tollgate/guard/keyid"
)

// FuzzGlobalChange: a journal message of any shape decodes, or is
// refused, and its route is checked, without a panic; a route accepted is
// one of the operator API's global routes with no raw key in it.
func FuzzGlobalChange(f *testing.F) {
	h, err := keyid.New([]byte("0123456789abcdef-secret"))
	if err != nil {
		f.Fatal(err)
	}
	s := &Server{hasher: h}
	f.Add([]byte(`{"id":"x","origin":"eu","time_us":1,"method":"PUT","path":"/admin/v1/blocklist/kid:abc","body":"e30="}`))
	f.Add([]byte(`{"method":"DELETE","path":"/admin/v1/penalties/sk_live_1"}`))
	f.Add([]byte(`{"method":"PUT","path":"/admin/v1/rules"}`))
	f.Add([]byte(`{"method":"POST","path":"/admin/v1/keys/k/reset"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var c globalChange
		if json.Unmarshal(data, &c) != nil {
			return
		}
		p, ok := s.globalPath(c.Method, c.Path)
		if !ok {
			return
		}
		if c.Method != http.MethodPut && c.Method != http.MethodDelete {
			t.Fatalf("globalPath accepted method %q", c.Method)
		}
		if p2, ok2 := s.globalPath(c.Method, p); !ok2 || p2 != p {
			t.Fatalf("globalPath(%q) = %q, and again %q %v: not stable", c.Path, p, p2, ok2)
		}
		_, _ = http.NewRequest(c.Method, p+"?"+c.Query, nil)
	})
}
