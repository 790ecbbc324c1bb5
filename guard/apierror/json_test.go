package apierror

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"testing"
)

// oddStrings are strings every escaping case of AppendString meets.
var oddStrings = []string{
	"", "plain", "a<b>&c", `q"uo\te`, "tab\tnl\n\b\f\r\x01\x1f\x00", "\u2028\u2029", "k\xff\xfe",
	"日本", "\u007f", "\xe2\x80", "mixed <\u2028> \xc0\xaf \" end", "\U0001F600",
}

// reference is s (a string, or a map for a body) through encoding/json
// with e's SetEscapeHTML, without the encoder's newline.
func reference(t testing.TB, v any, e Escaping) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(e == EscapeHTML)
	if err := enc.Encode(v); err != nil {
		t.Fatal(err)
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// TestAppendStringMatchesJSON: AppendString writes what encoding/json
// writes, in both escapings, from a string and from a byte slice alike.
func TestAppendStringMatchesJSON(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(3, 4))
	inputs := append([]string(nil), oddStrings...)
	for range 2000 {
		// Random concatenations of the odd strings and random bytes.
		var b []byte
		for range rng.IntN(6) {
			if rng.IntN(2) == 0 {
				b = append(b, oddStrings[rng.IntN(len(oddStrings))]...)
			} else {
				b = append(b, byte(rng.IntN(256)))
			}
		}
		inputs = append(inputs, string(b))
	}
	for _, e := range []Escaping{EscapeJSON, EscapeHTML} {
		for _, s := range inputs {
			want := reference(t, s, e)
			if got := AppendString(nil, s, e); !bytes.Equal(got, want) {
				t.Fatalf("escaping %d, %q: got %s, encoding/json %s", e, s, got, want)
			}
			if got := AppendString([]byte("prefix"), []byte(s), e); string(got) != "prefix"+string(want) {
				t.Fatalf("escaping %d, []byte %q: got %s, encoding/json %s", e, s, got, want)
			}
		}
	}
}

// FuzzAppendString: whatever the input, AppendString writes what
// encoding/json writes, and the result decodes back (invalid UTF-8 as
// U+FFFD).
func FuzzAppendString(f *testing.F) {
	for _, s := range oddStrings {
		f.Add(s, false)
	}
	f.Fuzz(func(t *testing.T, s string, html bool) {
		e := EscapeJSON
		if html {
			e = EscapeHTML
		}
		got := AppendString(nil, s, e)
		if want := reference(t, s, e); !bytes.Equal(got, want) {
			t.Fatalf("%q: got %s, encoding/json %s", s, got, want)
		}
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%q: %s does not decode: %v", s, got, err)
		}
		if want := string([]rune(s)); back != want {
			t.Fatalf("%q: decodes to %q, want %q", s, back, want)
		}
	})
}

// TestAppendBody: the error body is encoding/json's encoding of
// {"error":{"code","message"}} (keys in that order), and AppendFields
// with braces around it is the error object.
func TestAppendBody(t *testing.T) {
	t.Parallel()
	for _, e := range []Escaping{EscapeJSON, EscapeHTML} {
		for _, msg := range oddStrings {
			want := reference(t, map[string]any{"error": map[string]string{"code": RateLimitExceeded, "message": msg}}, e)
			if got := AppendBody(nil, RateLimitExceeded, msg, e); !bytes.Equal(got, want) {
				t.Errorf("escaping %d, %q: got %s, want %s", e, msg, got, want)
			}
			if got := AppendBody(nil, RateLimitExceeded, []byte(msg), e); !bytes.Equal(got, want) {
				t.Errorf("escaping %d, []byte %q: got %s, want %s", e, msg, got, want)
			}
			obj := append(AppendFields([]byte("{"), RateLimitExceeded, msg, e), '}')
			if want := reference(t, map[string]string{"code": RateLimitExceeded, "message": msg}, e); !bytes.Equal(obj, want) {
				t.Errorf("escaping %d, %q: fields %s, want %s", e, msg, obj, want)
			}
		}
	}
}

// TestWrite: the operator API's error answer is what it always was: the
// body encoding/json's encoder writes (HTML escaped, a final newline) as
// application/json with the status.
func TestWrite(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		code   string
		msg    string
	}{
		{"plain", http.StatusNotFound, NotFound, "no such operator API route: GET /admin/v1/nope"},
		{"markup", http.StatusUnauthorized, Unauthorized, "a valid operator token is required: Authorization: Bearer <TOLLGATE_ADMIN_TOKEN>"},
		{"odd", http.StatusBadRequest, InvalidRequest, "tab\t\"quote\" \xff \u2028 & more"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := httptest.NewRecorder()
			Write(rec, tt.status, tt.code, tt.msg)
			var want bytes.Buffer
			_ = json.NewEncoder(&want).Encode(map[string]any{"error": map[string]string{"code": tt.code, "message": tt.msg}})
			if rec.Code != tt.status || rec.Header().Get("Content-Type") != "application/json" || rec.Body.String() != want.String() {
				t.Errorf("got %d %q %q, want %d application/json %q", rec.Code, rec.Header().Get("Content-Type"), rec.Body.String(), tt.status, want.String())
			}
		})
	}
}

// TestValue: an error with more members encodes as the same map always
// did; the caller's members are left alone and cannot replace the code.
func TestValue(t *testing.T) {
	t.Parallel()
	members := map[string]any{"revision": uint64(7), "bytes": 12, "sha256": "ab", "cause": "bad <wire>", "code": "X"}
	got, err := json.MarshalIndent(Value(RulesCorrupt, "the entry is corrupt", members), "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := json.MarshalIndent(map[string]any{"error": map[string]any{"code": RulesCorrupt, "message": "the entry is corrupt",
		"revision": uint64(7), "bytes": 12, "sha256": "ab", "cause": "bad <wire>"}}, "", "  ")
	if !bytes.Equal(got, want) {
		t.Errorf("got\n%s\nwant\n%s", got, want)
	}
	if members["code"] != "X" || len(members) != 5 {
		t.Errorf("members changed: %v", members)
	}
	if got := Value(NotFound, "m", nil)["error"].(map[string]any); len(got) != 2 {
		t.Errorf("nil members: %v", got)
	}
}

func BenchmarkAppendBody(b *testing.B) {
	for _, bc := range []struct {
		name string
		e    Escaping
	}{{"json", EscapeJSON}, {"html", EscapeHTML}} {
		b.Run(bc.name, func(b *testing.B) {
			buf := make([]byte, 0, 256)
			msg := []byte(`Rate limit "free-default" exceeded: 5 per 60 seconds. Retry after 12 seconds.`)
			b.ReportAllocs()
			for b.Loop() {
				buf = AppendBody(buf[:0], RateLimitExceeded, msg, bc.e)
			}
		})
	}
}
