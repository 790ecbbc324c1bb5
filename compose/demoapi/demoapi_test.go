package demoapi_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/tollgate/tollgate/compose/demoapi"
)

type answer struct {
	OK      bool   `json:"ok"`
	Service string `json:"service"`
	Method  string `json:"method"`
	Path    string `json:"path"`
	Query   string `json:"query"`
	SleptMS *int64 `json:"slept_ms"`
	Error   string `json:"error"`
}

func serve(t *testing.T, method, target string) (*httptest.ResponseRecorder, answer) {
	t.Helper()
	rec := httptest.NewRecorder()
	demoapi.Handler().ServeHTTP(rec, httptest.NewRequest(method, target, nil))
	var a answer
	if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil {
		t.Fatalf("%s %s: body %q: %v", method, target, rec.Body, err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	return rec, a
}

func TestAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, method, target string
		status               int
		want                 answer
	}{
		{"any path", "GET", "/v1/users/42", 200, answer{OK: true, Service: demoapi.Service, Method: "GET", Path: "/v1/users/42"}},
		{"root", "GET", "/", 200, answer{OK: true, Service: demoapi.Service, Method: "GET", Path: "/"}},
		{"post with query", "POST", "/v1/orders?x=1", 200, answer{OK: true, Service: demoapi.Service, Method: "POST", Path: "/v1/orders", Query: "x=1"}},
		{"slow, zero", "GET", "/v1/slow?ms=0", 200, answer{OK: true, Service: demoapi.Service, Method: "GET", Path: "/v1/slow", Query: "ms=0"}},
		{"slow, negative", "GET", "/v1/slow?ms=-1", 400, answer{Service: demoapi.Service}},
		{"slow, too long", "GET", "/v1/slow?ms=10001", 400, answer{Service: demoapi.Service}},
		{"slow, not a number", "GET", "/v1/slow?ms=soon", 400, answer{Service: demoapi.Service}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec, got := serve(t, tt.method, tt.target)
			if rec.Code != tt.status {
				t.Fatalf("status %d, want %d", rec.Code, tt.status)
			}
			if tt.status == 400 {
				if !strings.Contains(got.Error, "10000") {
					t.Errorf("error %q does not give the bound", got.Error)
				}
				got.Error = ""
			}
			got.SleptMS = nil
			if got != tt.want {
				t.Errorf("answer %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestSlowWaits(t *testing.T) {
	t.Parallel()
	start := time.Now()
	rec, got := serve(t, "GET", "/v1/slow?ms=30")
	if took := time.Since(start); took < 30*time.Millisecond {
		t.Errorf("answered after %v, want at least 30ms", took)
	}
	if rec.Code != 200 || got.SleptMS == nil || *got.SleptMS != 30 {
		t.Errorf("status %d, slept_ms %v", rec.Code, got.SleptMS)
	}
}

func TestSlowEndsWhenTheClientLeaves(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	req := httptest.NewRequestWithContext(ctx, "GET", "/v1/slow?ms=10000", nil)
	rec := httptest.NewRecorder()
	start := time.Now()
	demoapi.Handler().ServeHTTP(rec, req)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("a gone client held the handler %v", took)
	}
}
