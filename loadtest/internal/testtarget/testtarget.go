// Package testtarget starts in-process servers for the load generator's own
// tests and stops them with tb.Cleanup: an HTTP server ([StartHTTP]) and an
// Envoy rate-limit gRPC server ([StartRLS]), both on OS-chosen loopback
// ports, both counting requests per API key. They stand in for whatever a
// load test points at; they model nothing of the gateway.
package testtarget

import (
	"context"
	"encoding/json"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
)

// HTTP is a running HTTP test server.
type HTTP struct {
	// URL is the server's base URL, http://127.0.0.1:port.
	URL string

	requests atomic.Int64
	conns    atomic.Int64
	mu       sync.Mutex
	byKey    map[string]int64 // guarded by mu
}

// Handler answers one request whose key (X-API-Key, else the JSON body's
// api_key) is key. n is the request's number, from 1. The body has been
// read, and is gone, when the key came from it.
type Handler func(w http.ResponseWriter, r *http.Request, key string, n int64)

// StartHTTP starts an HTTP server that counts each request under its key
// and calls h, or answers 200 "ok" when h is nil.
func StartHTTP(tb testing.TB, h Handler) *HTTP {
	tb.Helper()
	s := &HTTP{byKey: map[string]int64{}}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" && r.Body != nil {
			var body struct {
				APIKey string `json:"api_key"`
			}
			if err := json.NewDecoder(r.Body).Decode(&body); err == nil {
				key = body.APIKey
			}
		}
		n := s.requests.Add(1)
		s.mu.Lock()
		s.byKey[key]++
		s.mu.Unlock()
		if h == nil {
			_, _ = w.Write([]byte("ok"))
			return
		}
		h(w, r, key, n)
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.conns.Add(1)
		}
	}
	srv.Start()
	tb.Cleanup(srv.Close)
	s.URL = srv.URL
	return s
}

// Requests returns the number of requests received.
func (s *HTTP) Requests() int64 { return s.requests.Load() }

// Conns returns the number of connections accepted.
func (s *HTTP) Conns() int64 { return s.conns.Load() }

// ByKey returns a copy of the request counts per key.
func (s *HTTP) ByKey() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.byKey)
}

// Decide answers one ShouldRateLimit call; n is the call's number, from 1.
type Decide func(ctx context.Context, req *rlsv3.RateLimitRequest, n int64) (*rlsv3.RateLimitResponse, error)

// RLS is a running rate-limit gRPC server.
type RLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	// Addr is the server's host:port.
	Addr string

	decide Decide
	calls  atomic.Int64
	mu     sync.Mutex
	byKey  map[string]int64 // guarded by mu; from the first descriptor's api_key
}

// StartRLS starts a gRPC server whose ShouldRateLimit calls decide.
func StartRLS(tb testing.TB, decide Decide) *RLS {
	tb.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("listen: %v", err)
	}
	s := &RLS{Addr: lis.Addr().String(), decide: decide, byKey: map[string]int64{}}
	srv := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(srv, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lis)
	}()
	tb.Cleanup(func() {
		srv.Stop()
		<-done
	})
	return s
}

// ShouldRateLimit counts the call and asks decide.
func (s *RLS) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	n := s.calls.Add(1)
	var key string
	if ds := req.GetDescriptors(); len(ds) > 0 {
		for _, e := range ds[0].GetEntries() {
			if e.GetKey() == "api_key" {
				key = e.GetValue()
			}
		}
	}
	s.mu.Lock()
	s.byKey[key]++
	s.mu.Unlock()
	return s.decide(ctx, req, n)
}

// Calls returns the number of calls received.
func (s *RLS) Calls() int64 { return s.calls.Load() }

// ByKey returns a copy of the call counts per api_key.
func (s *RLS) ByKey() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.byKey)
}
