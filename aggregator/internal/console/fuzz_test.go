package console

import (
	"encoding/json"
	"net/http"
	"testing"
)

// FuzzSignIn: whatever the body, sign-in answers 200 only for the tokens
// or a live code, a clear error otherwise, and never panics.
func FuzzSignIn(f *testing.F) {
	for _, s := range []string{`{"token":"` + adminTok + `"}`, `{"code":"x"}`, `{}`, `{"token":1}`, `[`, `{"token":"a"}{}`, ""} {
		f.Add(s)
	}
	s := newServer(adminTok, viewerTok)
	f.Fuzz(func(t *testing.T, body string) {
		rec := s.do(req("POST", "/console/session", body, "Origin", self))
		switch rec.Code {
		case http.StatusOK:
			var in struct{ Token string }
			if err := json.Unmarshal([]byte(body), &in); err != nil || (in.Token != adminTok && in.Token != viewerTok) {
				t.Fatalf("signed in with %q", body)
			}
		case http.StatusBadRequest, http.StatusUnauthorized, http.StatusRequestEntityTooLarge:
			if errCode(rec) == "" {
				t.Fatalf("%d without an error code: %s", rec.Code, rec.Body)
			}
		default:
			t.Fatalf("%q: %d %s", body, rec.Code, rec.Body)
		}
	})
}
