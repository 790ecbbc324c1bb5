package gateway_test

import (
	"testing"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/tollgate/tollgate/gateway"
)

// TestEnvoyRLS: the gateway serves Envoy's rate-limit service and the gRPC
// health service on grpc_listen, sharing counters with HTTP.
func TestEnvoyRLS(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{
		rules: `
rules:
  - {id: two, match: {}, algorithm: token_bucket, capacity: 2, rate: 2/1h}
`,
		config: func(c *gateway.Config) { c.GRPCListen = "127.0.0.1:0" },
	})
	conn, err := grpc.NewClient(e.gw.addrs.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()

	hr, err := healthpb.NewHealthClient(conn).Check(t.Context(), &healthpb.HealthCheckRequest{Service: "envoy.service.ratelimit.v3.RateLimitService"})
	if err != nil || hr.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", hr, err)
	}

	// One unit through HTTP, one through RLS, then RLS is over the limit.
	if resp, _ := e.check(map[string]any{"api_key": "sk_envoy", "endpoint": "/e"}); resp.StatusCode != 200 {
		t.Fatalf("check: %d", resp.StatusCode)
	}
	client := rlsv3.NewRateLimitServiceClient(conn)
	call := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "sk_envoy"}, {Key: "path", Value: "/e"}},
	}}}
	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		resp, err := client.ShouldRateLimit(t.Context(), call)
		if err != nil {
			t.Fatal(err)
		}
		if resp.GetOverallCode() != want {
			t.Fatalf("call %d: %v, want %v", i, resp.GetOverallCode(), want)
		}
		headers := map[string]string{}
		for _, h := range resp.GetResponseHeadersToAdd() {
			headers[h.GetKey()] = h.GetValue()
		}
		if headers["X-RateLimit-Limit"] != "2" || headers["X-RateLimit-Remaining"] != "0" {
			t.Errorf("call %d headers %v", i, headers)
		}
		if (want == rlsv3.RateLimitResponse_OVER_LIMIT) != (headers["Retry-After"] != "") {
			t.Errorf("call %d: Retry-After %q", i, headers["Retry-After"])
		}
	}
	if v := e.metric(e.gw, "tollgate_rls_calls_total", `decision="rejected"`); v != 1 {
		t.Errorf("tollgate_rls_calls_total rejected = %v", v)
	}
	// RLS decisions count per rule like HTTP ones: 2 admitted (HTTP, RLS), 1 rejected.
	if v := e.metric(e.gw, "tollgate_checks_total", `decision="allowed"`, `rule="two"`); v != 2 {
		t.Errorf("tollgate_checks_total allowed, rule two = %v, want 2", v)
	}
	if v := e.metric(e.gw, "tollgate_checks_total", `decision="rejected"`, `rule="two"`); v != 1 {
		t.Errorf("tollgate_checks_total rejected, rule two = %v, want 1", v)
	}
}

// TestEnvoyRLSDecidesLeasedCallsInline: a call the fast path answers is
// decided on the connection's reading goroutine; only calls that need
// Redis are handed off, and every call gets its answer either way.
func TestEnvoyRLSDecidesLeasedCallsInline(t *testing.T) {
	t.Parallel()
	e := newEnv(t, envOptions{
		rules: `
rules:
  - {id: window, match: {}, algorithm: fixed_window, limit: 100000, window: 1h}
`,
		config: func(c *gateway.Config) { c.GRPCListen = "127.0.0.1:0" },
	})
	conn, err := grpc.NewClient(e.gw.addrs.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := rlsv3.NewRateLimitServiceClient(conn)
	call := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*ratelimitv3.RateLimitDescriptor{{
		Entries: []*ratelimitv3.RateLimitDescriptor_Entry{{Key: "api_key", Value: "sk_inline"}, {Key: "path", Value: "/i"}},
	}}}
	const calls = 200
	for i := range calls {
		resp, err := client.ShouldRateLimit(t.Context(), call)
		if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
			t.Fatalf("call %d: %v %v", i, resp.GetOverallCode(), err)
		}
	}
	inline, async := gateway.RLSCalls(e.gw.srv)
	if inline+async != calls || async == 0 || inline < calls/2 {
		t.Errorf("calls answered inline %d, handed off %d; want the first handed off (Redis) and most of %d inline (leases)", inline, async, calls)
	}
	if v := e.metric(e.gw, "tollgate_rls_calls_total", `decision="allowed"`); v != calls {
		t.Errorf("tollgate_rls_calls_total allowed = %v, want %d", v, calls)
	}
}
