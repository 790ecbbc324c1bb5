package adminapi

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// TestFitAudit: every audit entry fits the audit topic; a ruleset's source
// goes first (the old one's before the new one's), its version, hash and
// size stay.
func TestFitAudit(t *testing.T) {
	t.Parallel()
	src := func(n int, c string) string { return strings.Repeat(c+"\n", n/2) }
	tests := []struct {
		name              string
		before, after     []byte
		keepBefore, keepA bool // source kept
	}{
		{"small", rulesState(1, src(1000, "a")), rulesState(2, src(1000, "b")), true, true},
		{"both large", rulesState(1, src(500<<10, "a")), rulesState(2, src(500<<10, "b")), false, true},
		{"new one huge", rulesState(1, src(10<<10, "a")), rulesState(2, src(900<<10, "<")), false, false},
		{"not a ruleset", mustJSON(map[string]string{"x": strings.Repeat("y", 900<<10)}), []byte("null"), false, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := &tollgatev1.AuditEntry{Kind: "rules", Subject: "rules", Before: bytes.Clone(tt.before), After: bytes.Clone(tt.after)}
			fitAudit(e)
			if n := proto.Size(e); n > maxAuditEntry {
				t.Fatalf("entry of %d bytes, over %d", n, maxAuditEntry)
			}
			for _, side := range []struct {
				got, orig []byte
				keep      bool
			}{{e.Before, tt.before, tt.keepBefore}, {e.After, tt.after, tt.keepA}} {
				if side.keep != bytes.Equal(side.got, side.orig) {
					t.Errorf("kept %v, want %v: %.200s", !side.keep, side.keep, side.got)
				}
				var m map[string]any
				if !side.keep && json.Unmarshal(side.got, &m) == nil {
					if _, ok := m["source"]; ok {
						t.Errorf("source still there: %.200s", side.got)
					}
					if m["hash"] == nil && m["sha256"] == nil {
						t.Errorf("no hash left to identify it: %.200s", side.got)
					}
				}
			}
		})
	}
}

// FuzzIfMatch: any If-Match parses to a precondition or an error, never a
// panic; what is accepted is a version or a revision, not both.
func FuzzIfMatch(f *testing.F) {
	for _, s := range []string{"", "7", `"7"`, "r12", `"r12"`, "r0", "-1", "rr1", "r", "18446744073709551616", " 3 "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r := httptest.NewRequest("PUT", "/admin/v1/rules", nil)
		r.Header["If-Match"] = []string{s}
		p, err := ifMatch(r)
		if err != nil {
			if p.set {
				t.Fatalf("%q: error %v with a precondition", s, err)
			}
			return
		}
		if p.set && (p.rev != 0) == (p.version >= 0) {
			t.Fatalf("%q: version %d and revision %d", s, p.version, p.rev)
		}
	})
}
