package keyid

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"strings"
	"testing"
)

func TestID(t *testing.T) {
	t.Parallel()
	h, err := New([]byte("s3cret-0123456789"))
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"", "sk_prod_acme_1", strings.Repeat("x", 300), "{a}:b*"} {
		t.Run(key[:min(len(key), 12)], func(t *testing.T) {
			m := hmac.New(sha256.New, []byte("s3cret-0123456789"))
			m.Write([]byte(key))
			want := base64.RawURLEncoding.EncodeToString(m.Sum(nil)[:16])
			got := h.ID(key)
			if got != want || len(got) != Len || !Valid(got) {
				t.Fatalf("ID(%q) = %q, want %q", key, got, want)
			}
		})
	}
	other, _ := New([]byte("other-0123456789abc"))
	if other.ID("k") == h.ID("k") {
		t.Fatal("key_id does not depend on the secret")
	}
	if _, err := New(nil); err != ErrNoSecret {
		t.Fatalf("New(nil) = %v", err)
	}
	for _, n := range []int{1, MinSecretLen - 1} {
		if _, err := New(make([]byte, n)); !errors.Is(err, ErrShortSecret) {
			t.Errorf("New(%d bytes) = %v, want ErrShortSecret", n, err)
		}
	}
	if _, err := New(make([]byte, MinSecretLen)); err != nil {
		t.Errorf("New(%d bytes) = %v", MinSecretLen, err)
	}
}

func TestPrefix(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ key, want string }{
		{"sk_prod_abcdef123456789", "sk_prod_ab…"},
		{"short", "sh…"},
		{"", "…"},
		{"ab\x00cdefghijkl", "ab…"},
	} {
		if got := Prefix(tc.key); got != tc.want {
			t.Errorf("Prefix(%q) = %q, want %q", tc.key, got, tc.want)
		}
	}
}

func BenchmarkID(b *testing.B) {
	h, _ := New([]byte("s3cret-0123456789"))
	buf := make([]byte, 0, Len)
	b.ReportAllocs()
	for b.Loop() {
		buf = h.AppendID(buf[:0], "sk_prod_acme_1")
	}
}

func FuzzID(f *testing.F) {
	h, _ := New([]byte("s3cret-0123456789"))
	f.Add("sk_prod_acme_1")
	f.Add("{tenant}:*")
	f.Fuzz(func(t *testing.T, key string) {
		id := h.ID(key)
		if !Valid(id) || strings.ContainsAny(id, "{}:*") {
			t.Fatalf("bad key_id %q", id)
		}
		_ = Prefix(key)
	})
}
