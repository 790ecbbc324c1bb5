package gateway_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/tollgate/tollgate/gateway"
)

// testPKI is a CA with a server certificate for 127.0.0.1 and a client
// certificate, made in the test.
type testPKI struct {
	dir                    string
	caPool                 *x509.CertPool
	caFile                 string
	serverCert, serverKey  string
	client, otherCAsClient tls.Certificate
}

func newPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{dir: t.TempDir(), caPool: x509.NewCertPool()}
	ca, caKey := selfSigned(t, "tollgate test CA")
	p.caPool.AddCert(ca)
	p.caFile = p.write(t, "ca.pem", "CERTIFICATE", ca.Raw)

	srv, srvKey := issue(t, ca, caKey, "gateway", x509.ExtKeyUsageServerAuth)
	p.serverCert = p.write(t, "server.pem", "CERTIFICATE", srv.Raw)
	p.serverKey = p.write(t, "server-key.pem", "PRIVATE KEY", pkcs8(t, srvKey))

	cli, cliKey := issue(t, ca, caKey, "envoy", x509.ExtKeyUsageClientAuth)
	p.client = tls.Certificate{Certificate: [][]byte{cli.Raw}, PrivateKey: cliKey}

	other, otherKey := selfSigned(t, "another CA")
	rogue, rogueKey := issue(t, other, otherKey, "rogue", x509.ExtKeyUsageClientAuth)
	p.otherCAsClient = tls.Certificate{Certificate: [][]byte{rogue.Raw}, PrivateKey: rogueKey}
	return p
}

func (p *testPKI) write(t *testing.T, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(p.dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func template(cn string) *x509.Certificate {
	serial, _ := rand.Int(rand.Reader, big.NewInt(1<<62))
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
}

func selfSigned(t *testing.T, cn string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := template(cn)
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	return sign(t, tmpl, tmpl, key, key), key
}

// sign makes the certificate of tmpl for key, signed by parent's key
// parentKey.
func sign(t *testing.T, tmpl, parent *x509.Certificate, key, parentKey *ecdsa.PrivateKey) *x509.Certificate {
	t.Helper()
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return cert
}

func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, usage x509.ExtKeyUsage) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := template(cn)
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{usage}
	tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1)}
	return sign(t, tmpl, ca, key, caKey), key
}

func pkcs8(t *testing.T, key *ecdsa.PrivateKey) []byte {
	t.Helper()
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// shouldRateLimit makes one RLS call over conn and returns its error.
func shouldRateLimit(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: "edge",
		Descriptors: []*ratelimitv3.RateLimitDescriptor{{Entries: []*ratelimitv3.RateLimitDescriptor_Entry{
			{Key: "api_key", Value: "sk_tls"}}}},
	})
	return err
}

// TestGRPCMutualTLS: with grpc_tls_client_ca_file the Envoy RLS listener
// serves only clients presenting a certificate of that CA; a client
// without one, with another CA's, or in plaintext is refused.
func TestGRPCMutualTLS(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	e := newEnv(t, envOptions{rules: proxyRules, config: func(c *gateway.Config) {
		c.GRPCListen = "127.0.0.1:0"
		c.GRPCTLSCertFile, c.GRPCTLSKeyFile, c.GRPCTLSClientCAFile = pki.serverCert, pki.serverKey, pki.caFile
	}})
	addr := e.gw.addrs.GRPC
	tlsWith := func(certs ...tls.Certificate) credentials.TransportCredentials {
		return credentials.NewTLS(&tls.Config{RootCAs: pki.caPool, Certificates: certs, MinVersion: tls.VersionTLS12})
	}
	if err := shouldRateLimit(t, addr, tlsWith(pki.client)); err != nil {
		t.Fatalf("client with a certificate of the CA: %v", err)
	}
	for name, creds := range map[string]credentials.TransportCredentials{
		"no client certificate":           tlsWith(),
		"another CA's client certificate": tlsWith(pki.otherCAsClient),
		"plaintext":                       insecure.NewCredentials(),
	} {
		if err := shouldRateLimit(t, addr, creds); err == nil {
			t.Errorf("%s: served", name)
		}
	}
}

// TestGRPCServerTLS: with a certificate but no client CA the listener
// serves TLS to any client, and refuses plaintext.
func TestGRPCServerTLS(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	e := newEnv(t, envOptions{rules: proxyRules, config: func(c *gateway.Config) {
		c.GRPCListen = "127.0.0.1:0"
		c.GRPCTLSCertFile, c.GRPCTLSKeyFile = pki.serverCert, pki.serverKey
	}})
	addr := e.gw.addrs.GRPC
	if err := shouldRateLimit(t, addr, credentials.NewTLS(&tls.Config{RootCAs: pki.caPool, MinVersion: tls.VersionTLS12})); err != nil {
		t.Fatalf("TLS client: %v", err)
	}
	if err := shouldRateLimit(t, addr, insecure.NewCredentials()); err == nil {
		t.Error("plaintext client served")
	}
}

// TestGRPCTLSConfig: the TLS settings are checked at start, naming their
// variables.
func TestGRPCTLSConfig(t *testing.T) {
	t.Parallel()
	pki := newPKI(t)
	base := gateway.Config{KeySecret: testSecret, GRPCListen: "127.0.0.1:0", APIListen: gateway.Off, MetricsListen: gateway.Off}
	for _, tc := range []struct {
		name   string
		mutate func(*gateway.Config)
		want   string
	}{
		{"cert without key", func(c *gateway.Config) { c.GRPCTLSCertFile = pki.serverCert }, "TOLLGATE_GRPC_TLS_KEY_FILE"},
		{"client CA without cert", func(c *gateway.Config) { c.GRPCTLSClientCAFile = pki.caFile }, "TOLLGATE_GRPC_TLS_CERT_FILE"},
	} {
		c := base
		tc.mutate(&c)
		c.SetDefaults()
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error naming %s", tc.name, err, tc.want)
		}
	}
	e := newEnv(t, envOptions{rules: proxyRules})
	cfg := e.config()
	cfg.GRPCListen = "127.0.0.1:0"
	cfg.GRPCTLSCertFile, cfg.GRPCTLSKeyFile = pki.serverCert, pki.caFile // a certificate is not a key
	if _, err := gateway.New(cfg, nil); err == nil || !strings.Contains(err.Error(), "TOLLGATE_GRPC_TLS_CERT_FILE") {
		t.Errorf("bad key file: %v", err)
	}
	cfg.GRPCTLSKeyFile, cfg.GRPCTLSClientCAFile = pki.serverKey, pki.serverKey // a key is not a CA
	if _, err := gateway.New(cfg, nil); err == nil || !strings.Contains(err.Error(), "TOLLGATE_GRPC_TLS_CLIENT_CA_FILE") {
		t.Errorf("bad CA file: %v", err)
	}
}
