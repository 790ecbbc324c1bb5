package gateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync/atomic"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway/internal/h2grpc"
	"github.com/tollgate/tollgate/gateway/internal/metrics"
	"github.com/tollgate/tollgate/gateway/internal/rls"
	"github.com/tollgate/tollgate/guard"
)

// maxGRPCMessage bounds one gRPC request: RLS calls are small.
const maxGRPCMessage = 1 << 20

// Full gRPC method names served on grpc_listen.
const (
	shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
	healthCheck     = "/grpc.health.v1.Health/Check"
)

// grpcServer is the Envoy rate-limit service listener, with the gRPC
// health service's Check (grpc.health.v1) for Envoy's cluster health
// checks. It is a lean HTTP/2 server (gateway/internal/h2grpc): a call
// the fast path answers is decided on its connection's reading goroutine
// and answered with the other calls of the same read in one write; only
// calls that need Redis go to a goroutine of their own.
type grpcServer struct {
	srv      *h2grpc.Server
	ln       net.Listener
	stopping atomic.Bool // health answers NOT_SERVING
}

func newGRPCServer(g guard.Checker, m *metrics.Metrics, log *slog.Logger, tc *tls.Config) *grpcServer {
	gs := &grpcServer{}
	gs.srv = h2grpc.New(h2grpc.Options{
		MaxMessage: maxGRPCMessage,
		TLS:        tc,
		Context:    guard.LocalOnly,
		Logger:     log.With(slog.String("component", "grpc")),
	})
	srv := rls.New(g, rls.WithLogger(log.With(slog.String("component", "rls"))))
	gs.srv.Handle(shouldRateLimit, rlsHandler(srv, m))
	gs.srv.Handle(healthCheck, gs.health)
	return gs
}

// rlsHandler decides ShouldRateLimit calls, counted by outcome.
func rlsHandler(srv *rls.Server, m *metrics.Metrics) h2grpc.Handler {
	return func(ctx context.Context, msg, out []byte) ([]byte, error) {
		x, err := rls.DecodeExchange(msg)
		if err != nil {
			return out, status.Error(codes.Internal, "tollgate: "+err.Error())
		}
		defer x.Release()
		resp, err := srv.Decide(ctx, x)
		if errors.Is(err, guard.ErrWouldBlock) {
			return out, h2grpc.ErrWouldBlock
		}
		m.RLSCall(resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT, status.Code(err))
		if err != nil {
			return out, err
		}
		if out, err = rls.AppendResponse(out, resp); err != nil {
			return out, status.Error(codes.Internal, "tollgate: "+err.Error())
		}
		return out, nil
	}
}

// health answers grpc.health.v1.Health/Check: SERVING for the server as a
// whole ("") and the rate-limit service until shutdown starts, then
// NOT_SERVING; NotFound for other services.
func (g *grpcServer) health(_ context.Context, msg, out []byte) ([]byte, error) {
	var req healthpb.HealthCheckRequest
	if err := proto.Unmarshal(msg, &req); err != nil {
		return out, status.Error(codes.Internal, "tollgate: decode HealthCheckRequest: "+err.Error())
	}
	if svc := req.GetService(); svc != "" && svc != rlsv3.RateLimitService_ServiceDesc.ServiceName {
		return out, status.Error(codes.NotFound, "unknown service")
	}
	st := healthpb.HealthCheckResponse_SERVING
	if g.stopping.Load() {
		st = healthpb.HealthCheckResponse_NOT_SERVING
	}
	b, err := proto.MarshalOptions{}.MarshalAppend(out, &healthpb.HealthCheckResponse{Status: st})
	if err != nil {
		return out, status.Error(codes.Internal, "tollgate: "+err.Error())
	}
	return b, nil
}

// grpcCredentials returns the Envoy RLS listener's TLS credentials (nil
// for plaintext): grpc_tls_cert_file and grpc_tls_key_file serve TLS, and
// grpc_tls_client_ca_file requires and verifies client certificates
// (mutual TLS), so that clients without one are refused in the handshake.
// Files are read once, at start.
func (c *Config) grpcCredentials() (*tls.Config, error) {
	if c.GRPCTLSCertFile == "" {
		return nil, nil
	}
	cert, err := tls.LoadX509KeyPair(c.GRPCTLSCertFile, c.GRPCTLSKeyFile)
	if err != nil {
		return nil, fmt.Errorf("grpc_tls_cert_file (%s), grpc_tls_key_file (%s): %w",
			configs.EnvName("grpc_tls_cert_file"), configs.EnvName("grpc_tls_key_file"), err)
	}
	tc := &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if c.GRPCTLSClientCAFile != "" {
		pem, err := os.ReadFile(c.GRPCTLSClientCAFile)
		if err != nil {
			return nil, fmt.Errorf("grpc_tls_client_ca_file (%s): %w", configs.EnvName("grpc_tls_client_ca_file"), err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("grpc_tls_client_ca_file (%s): %s holds no PEM certificate",
				configs.EnvName("grpc_tls_client_ca_file"), c.GRPCTLSClientCAFile)
		}
		tc.ClientCAs = pool
		tc.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return tc, nil
}

func (g *grpcServer) serve() error {
	if err := g.srv.Serve(g.ln); err != nil && !errors.Is(err, h2grpc.ErrServerClosed) {
		return err
	}
	return nil
}

// shutdown stops accepting calls and waits for those in flight until ctx
// is done, then cuts them.
func (g *grpcServer) shutdown(ctx context.Context) {
	g.stopping.Store(true)
	g.srv.Shutdown(ctx)
}
