package gateway_test

import (
	"bytes"
	"io"
	"net/http"
	"testing"
)

const benchRules = `
rules:
  - {id: big, match: {}, algorithm: token_bucket, capacity: 1000000000, rate: 1000000000/1s}
`

// BenchmarkCheckAPI: POST /v1/check over loopback against a real Redis,
// client and server in one process (ns/op and allocs count both sides).
func BenchmarkCheckAPI(b *testing.B) {
	e := newEnv(b, envOptions{rules: benchRules})
	url := "http://" + e.gw.addrs.API + "/v1/check"
	body := []byte(`{"api_key":"sk_bench","endpoint":"/v1/x","method":"GET"}`)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	b.ReportAllocs()
	b.SetParallelism(16) // enough callers to fill Redis pipelines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			resp, err := client.Post(url, "application/json", bytes.NewReader(body))
			if !answeredOK(b, resp, err) {
				return
			}
		}
	})
}

// answeredOK reads and closes the answer of a benchmark's request and
// reports whether it was a 200; it fails the benchmark when not.
func answeredOK(b *testing.B, resp *http.Response, err error) bool {
	if err != nil {
		b.Error(err)
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Errorf("status %d", resp.StatusCode)
		return false
	}
	return true
}

// BenchmarkProxy: GET through the proxy to an in-process upstream.
func BenchmarkProxy(b *testing.B) {
	e := newEnv(b, envOptions{rules: benchRules})
	url := "http://" + e.gw.addrs.Proxy + "/v1/x"
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
	b.ReportAllocs()
	b.SetParallelism(16) // enough callers to fill Redis pipelines
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		req.Header.Set("X-API-Key", "sk_bench")
		for pb.Next() {
			resp, err := client.Do(req)
			if !answeredOK(b, resp, err) {
				return
			}
		}
	})
}
