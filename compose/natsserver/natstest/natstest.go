// Package natstest starts embedded NATS servers for tests through package
// natsserver and stops them with tb.Cleanup. It is the only part that
// imports "testing", so binaries that use natsserver (make run) do not link
// it.
package natstest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/tollgate/tollgate/compose/internal/lifecycle"
	"github.com/tollgate/tollgate/compose/natsserver"
	"github.com/tollgate/tollgate/internal/service"
)

// StartTB starts a NATS server with JetStream (see natsserver.Start) for the
// test and registers its Stop with tb.Cleanup. The start is bounded by
// tb.Context. Any error fails the test at once.
func StartTB(tb testing.TB, opts ...natsserver.Option) *natsserver.Server {
	tb.Helper()
	return lifecycle.StartTB(tb, "nats server", func(ctx context.Context) (*natsserver.Server, error) {
		return natsserver.Start(ctx, opts...)
	})
}

// StartRegionsTB starts one NATS server per region, each with JetStream in
// its own domain (the region's name), linked hub and spoke by leafnodes:
// the first region's server listens for leafnodes and every other region's
// server links to it, so a core subject published in any region reaches
// subscribers in every region, through the hub. opts apply to every
// server. It returns once every link is up (each spoke has its link and
// the hub has one per spoke), in the order of regions; Stop is registered
// with tb.Cleanup. Any error fails the test at once.
func StartRegionsTB(tb testing.TB, regions []string, opts ...natsserver.Option) []*natsserver.Server {
	tb.Helper()
	if len(regions) == 0 {
		tb.Fatalf("natstest: no regions")
	}
	with := func(extra ...natsserver.Option) []natsserver.Option {
		return append(slices.Clone(opts), extra...)
	}
	hub := StartTB(tb, with(natsserver.WithDomain(regions[0]), natsserver.WithLeafnodeListen("127.0.0.1:0"))...)
	servers := []*natsserver.Server{hub}
	for _, r := range regions[1:] {
		servers = append(servers, StartTB(tb, with(natsserver.WithDomain(r),
			natsserver.WithLeafnodeRemotes(hub.LeafnodeURL()))...))
	}
	WaitLinkedTB(tb, servers)
	return servers
}

// WaitLinkedTB waits, within tb.Context and 15s, until the servers
// StartRegionsTB returned are all linked again (after HealLinks or Up),
// failing the test otherwise.
func WaitLinkedTB(tb testing.TB, servers []*natsserver.Server) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(tb.Context(), 15*time.Second)
	defer cancel()
	err := service.Poll(ctx, 10*time.Millisecond, func() (bool, error) {
		if servers[0].Leafnodes() != len(servers)-1 {
			return false, nil
		}
		for _, s := range servers[1:] {
			if s.Leafnodes() != 1 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		tb.Fatalf("natstest: regions not linked: %v", err)
	}
}

// Connect returns a client connection to url (a server's ClientURL), closed
// by tb.Cleanup. Any error fails the test at once.
func Connect(tb testing.TB, url string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		tb.Fatalf("natstest: connect %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// JetStream returns the JetStream of the server at url (in its own
// domain), on a connection of its own that tb.Cleanup closes. Any error
// fails the test at once.
func JetStream(tb testing.TB, url string) jetstream.JetStream {
	tb.Helper()
	js, err := jetstream.New(Connect(tb, url))
	if err != nil {
		tb.Fatalf("natstest: jetstream %s: %v", url, err)
	}
	return js
}
