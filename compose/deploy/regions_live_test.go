package deploy

import (
	"fmt"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/compose/natsserver/natstest"
	"github.com/tollgate/tollgate/internal/testwait"
)

// liveTimeout bounds each wait of the live regions test (a loaded machine).
const liveTimeout = 15 * time.Second

// TestLiveRegionsNATS starts the two regions' NATS servers from their
// configuration files, as nats-server parsed them, with only the addresses
// and the store directory replaced (free loopback ports, a temporary
// directory; the spoke's remote pointed at the hub's leafnode listener):
// the spoke links to the hub by leafnode, each answers JetStream in its
// own domain (distinct), and each reaches the other's domain across the link.
func TestLiveRegionsNATS(t *testing.T) {
	c := regionsDeployment(t)
	cfgs := natsConfigs(t, c)
	if len(cfgs) != 2 {
		t.Fatalf("want two NATS servers configured from files, have %d", len(cfgs))
	}
	// The hub first: the spoke's remote needs its leafnode address.
	if cfgs[0].opts.LeafNode.Port == 0 {
		cfgs[0], cfgs[1] = cfgs[1], cfgs[0]
	}
	hub, spoke := cfgs[0], cfgs[1]
	if hub.opts.LeafNode.Port == 0 || len(spoke.opts.LeafNode.Remotes) == 0 {
		t.Fatalf("want a hub with a leafnode listener and a spoke with a remote; have %s (port %d) and %s (%d remotes)",
			hub.service, hub.opts.LeafNode.Port, spoke.service, len(spoke.opts.LeafNode.Remotes))
	}

	if d := hub.opts.JetStreamDomain; d == "" || d == spoke.opts.JetStreamDomain {
		t.Fatalf("JetStream domains %q (%s) and %q (%s): want one of its own each", d, hub.service, spoke.opts.JetStreamDomain, spoke.service)
	}

	hubOpts := liveNATSOptions(t, hub.opts)
	hubOpts.LeafNode.Host, hubOpts.LeafNode.Port = "127.0.0.1", server.RANDOM_PORT
	hubSrv := startLiveNATS(t, hub.service, hubOpts)
	leafAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(hubOpts.LeafNode.Port))

	spokeOpts := liveNATSOptions(t, spoke.opts)
	for _, r := range spokeOpts.LeafNode.Remotes {
		for i, u := range r.URLs {
			via := *u
			via.Host = leafAddr
			r.URLs[i] = &via
		}
	}
	spokeSrv := startLiveNATS(t, spoke.service, spokeOpts)

	testwait.Eventually(t, liveTimeout, func() error {
		if h, s := hubSrv.NumLeafNodes(), spokeSrv.NumLeafNodes(); h != 1 || s != 1 {
			return fmt.Errorf("leafnode connections: %s has %d, %s has %d; want one each", hub.service, h, spoke.service, s)
		}
		return nil
	})

	servers := []struct {
		cfg natsConfig
		srv *server.Server
	}{{hub, hubSrv}, {spoke, spokeSrv}}
	for _, from := range servers {
		nc := natstest.Connect(t, from.srv.ClientURL())
		// Unnamed, the domain is the server's own.
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		if info, err := js.AccountInfo(t.Context()); err != nil || info.Domain != from.cfg.opts.JetStreamDomain {
			t.Fatalf("%s: JetStream answered %+v (%v); want domain %s", from.cfg.service, info, err, from.cfg.opts.JetStreamDomain)
		}
		for _, to := range servers {
			domain := to.cfg.opts.JetStreamDomain
			testwait.Eventually(t, liveTimeout, func() error {
				js, err := jetstream.NewWithDomain(nc, domain)
				if err != nil {
					return err
				}
				info, err := js.AccountInfo(t.Context())
				if err != nil {
					return fmt.Errorf("JetStream domain %s from %s: %w", domain, from.cfg.service, err)
				}
				if info.Domain != domain {
					return fmt.Errorf("JetStream domain %s from %s: answered by domain %q", domain, from.cfg.service, info.Domain)
				}
				return nil
			})
		}
	}
}

// liveNATSOptions returns a copy of parsed options with the listeners on
// free loopback ports, no monitoring port, the store in a temporary
// directory and no logging or signal handling of its own.
func liveNATSOptions(t *testing.T, parsed *server.Options) *server.Options {
	t.Helper()
	o := parsed.Clone()
	o.Host, o.Port = "127.0.0.1", server.RANDOM_PORT
	o.HTTPHost, o.HTTPPort = "", 0
	o.StoreDir = t.TempDir()
	o.NoLog, o.NoSigs = true, true
	return o
}

// startLiveNATS starts an embedded nats-server on o and shuts it down (and
// waits for it) when the test ends.
func startLiveNATS(t *testing.T, name string, o *server.Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(o)
	if err != nil {
		t.Fatalf("%s: nats-server: %v", name, err)
	}
	s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(liveTimeout) || !s.JetStreamEnabled() {
		t.Fatalf("%s: nats-server did not start with JetStream within %v", name, liveTimeout)
	}
	return s
}
