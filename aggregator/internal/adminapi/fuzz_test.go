package adminapi

import (
	"testing"
	"time"
)

// FuzzBodies feeds arbitrary bytes to every operator API body parser:
// never a panic, and whatever is accepted is within bounds.
func FuzzBodies(f *testing.F) {
	for _, s := range []string{``, `{}`, `{"ttl":"10m","reason":"x"}`, `{"limit":5}`, `{"factor":0.5,"ttl":"1h"}`,
		`{"version":3}`, `{"limit":1,"factor":2}`, `{"ttl":"-1s"}`, `{"version":1}{}`, `{"factor":1e400}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if req, err := parseListBody(b); err == nil {
			if req.ttl < 0 || req.ttl > 366*24*time.Hour || len(req.Reason) > maxReason {
				t.Fatalf("list body accepted out of bounds: %+v", req)
			}
		}
		if req, err := parseOverrideBody(b); err == nil {
			if (req.Limit == nil) == (req.Factor == nil) || (req.Limit != nil && *req.Limit < 1) || (req.Factor != nil && !(*req.Factor > 0)) {
				t.Fatalf("override body accepted: %+v", req)
			}
		}
		if req, err := parseRollbackBody(b); err == nil && req.Version < 1 {
			t.Fatalf("rollback accepted version %d", req.Version)
		}
	})
}
