// Package keyid turns API keys into key_ids: a keyed hash (HMAC-SHA-256
// truncated to 16 bytes, unpadded base64url, 22 characters) under a secret
// (TOLLGATE_KEY_SECRET). A key_id stands for its key everywhere outside the
// process that received it: Redis names, NATS KV keys, events, reports, logs
// and metrics never hold a raw key.
package keyid

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"
)

// Len is the length of a key_id.
const Len = 22

// MinSecretLen is the shortest secret New accepts, in bytes: the one
// minimum of the library (guard.New) and the processes
// (TOLLGATE_KEY_SECRET).
const MinSecretLen = 16

// Errors of New.
var (
	// ErrNoSecret is returned for an empty secret.
	ErrNoSecret = errors.New("keyid: empty secret")
	// ErrShortSecret is wrapped by the error of a secret shorter than
	// MinSecretLen.
	ErrShortSecret = errors.New("keyid: secret too short")
)

// Hasher derives key_ids under one secret. It is safe for concurrent use.
type Hasher struct {
	pool sync.Pool
}

// New returns a Hasher for secret, which must hold at least MinSecretLen
// bytes (ErrNoSecret, ErrShortSecret otherwise).
func New(secret []byte) (*Hasher, error) {
	switch {
	case len(secret) == 0:
		return nil, ErrNoSecret
	case len(secret) < MinSecretLen:
		return nil, fmt.Errorf("%w: %d bytes, at least %d needed", ErrShortSecret, len(secret), MinSecretLen)
	}
	key := append([]byte(nil), secret...)
	h := &Hasher{}
	h.pool.New = func() any { return hmac.New(sha256.New, key) }
	return h, nil
}

// ID returns the key_id of key.
func (h *Hasher) ID(key string) string {
	var buf [Len]byte
	h.AppendID(buf[:0], key)
	return string(buf[:])
}

// AppendID appends the key_id of key to dst.
func (h *Hasher) AppendID(dst []byte, key string) []byte {
	m := h.pool.Get().(hash.Hash)
	m.Reset()
	_, _ = m.Write([]byte(key))
	var sum [sha256.Size]byte
	m.Sum(sum[:0])
	h.pool.Put(m)
	return base64.RawURLEncoding.AppendEncode(dst, sum[:16])
}

// Valid reports whether s has the form of a key_id.
func Valid(s string) bool {
	if len(s) != Len {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// Prefix returns a short, non-secret prefix of key for humans: at most 10
// bytes and never more than half of the key, followed by "…".
func Prefix(key string) string {
	n := min(10, len(key)/2)
	var b strings.Builder
	b.Grow(n + 3)
	for i := 0; i < n; i++ {
		c := key[i]
		if c < 0x21 || c > 0x7e {
			break
		}
		b.WriteByte(c)
	}
	b.WriteString("…")
	return b.String()
}
