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
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/gateway/internal/metrics"
	"github.com/tollgate/tollgate/gateway/internal/rls"
	"github.com/tollgate/tollgate/guard"
)

// grpcStreamWorkers is the number of goroutines serving gRPC streams
// (parked until a call comes; each keeps its grown stack, a few KiB).
const grpcStreamWorkers = 256

// maxGRPCMessage bounds one gRPC request: RLS calls are small.
const maxGRPCMessage = 1 << 20

// grpcServer is the Envoy rate-limit service listener, with the standard
// gRPC health service (grpc.health.v1) for Envoy's cluster health checks.
type grpcServer struct {
	srv    *grpc.Server
	health *health.Server
	ln     net.Listener
}

func newGRPCServer(g guard.Checker, m *metrics.Metrics, log *slog.Logger, creds credentials.TransportCredentials) *grpcServer {
	opts := []grpc.ServerOption{
		grpc.MaxRecvMsgSize(maxGRPCMessage),
		// Serve streams on a pool of goroutines instead of a new one per
		// call, whose stack grows afresh every time (a quarter of gRPC's
		// CPU under load, docs/benchmarks.md). A call finding no idle
		// worker still gets a goroutine of its own, so the pool covers
		// the calls in flight at a busy gateway, not just the CPUs.
		grpc.NumStreamWorkers(grpcStreamWorkers),
		// RateLimitRequest and RateLimitResponse read and written by hand
		// (other messages, health checks included, by protobuf-go).
		grpc.ForceServerCodecV2(rls.Codec()),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
		grpc.ChainUnaryInterceptor(rlsInterceptor(m)),
	}
	if creds != nil {
		opts = append(opts, grpc.Creds(creds))
	}
	srv := grpc.NewServer(opts...)
	rls.New(g, rls.WithLogger(log.With(slog.String("component", "rls")))).Register(srv)
	hs := health.NewServer()
	hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	return &grpcServer{srv: srv, health: hs}
}

// grpcCredentials returns the Envoy RLS listener's TLS credentials (nil
// for plaintext): grpc_tls_cert_file and grpc_tls_key_file serve TLS, and
// grpc_tls_client_ca_file requires and verifies client certificates
// (mutual TLS), so that clients without one are refused in the handshake.
// Files are read once, at start.
func (c *Config) grpcCredentials() (credentials.TransportCredentials, error) {
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
	return credentials.NewTLS(tc), nil
}

// shouldRateLimit is the full gRPC method name of the Envoy RLS call.
const shouldRateLimit = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

// rlsInterceptor counts RLS calls by outcome.
func rlsInterceptor(m *metrics.Metrics) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if info.FullMethod == shouldRateLimit {
			r, _ := resp.(*rlsv3.RateLimitResponse)
			m.RLSCall(r.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT, status.Code(err))
		}
		return resp, err
	}
}

func (g *grpcServer) serve() error {
	if err := g.srv.Serve(g.ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
		return err
	}
	return nil
}

// shutdown stops accepting calls and waits for those in flight until ctx
// is done, then cuts them.
func (g *grpcServer) shutdown(ctx context.Context) {
	g.health.Shutdown()
	done := make(chan struct{})
	go func() {
		g.srv.GracefulStop()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		g.srv.Stop()
		<-done
	}
}
