// Package natsserver runs an embedded nats-server with JetStream on
// loopback, for tests and for the local stack (make run).
//
// A [Server] listens on a free 127.0.0.1 port by default (make run uses
// 127.0.0.1:4222) and keeps its JetStream store in a directory, so it can be
// taken down and brought back on the same port with the same store:
// [Server.Down] and [Server.Up] simulate an outage of any length,
// [Server.Restart] a quick bounce. Test code should use package natstest,
// which registers Stop with tb.Cleanup; this package does not link "testing"
// into binaries.
//
// The server is nats-server's server.NewServer with JetStream on, no
// authentication (hence loopback only), no signal handlers, no monitoring
// port and no cluster. It starts in about 5ms (15ms under the race
// detector); from the start of a JetStream KV put to its arrival at a
// watcher on the same connection takes about 50µs at the median on
// loopback (0.2ms under the race detector; TestKVPutWatchLatency logs the
// distribution).
//
// # Regions
//
// Servers of different regions are linked by leafnodes, each in its own
// JetStream domain ([WithDomain], the region's name): one server listens
// ([WithLeafnodeListen]) and the others link to it
// ([WithLeafnodeRemotes]). Core subjects cross the links; JetStream stays
// in each domain and keeps answering there while links are down.
// [Server.CutLinks] and [Server.HealLinks] cut and restore a server's
// links without stopping it, as a partition would: each remote is reached
// through a link proxy the Server owns (compose/linkproxy), and the proxy
// is what is cut. natstest.StartRegionsTB
// starts such a set of regions, linked hub and spoke.
//
// # What clients see across Down and Up, as observed with nats.go v1.55
//
// KV buckets, their history and their content survive Down/Up, Restart and a
// new Server on the same store directory (streams are file-backed).
//
// A nats.go connection reconnects by itself (by default 60 attempts, 2s
// apart; tests use MaxReconnects(-1) and a short ReconnectWait) within
// ReconnectWait of Up.
//
// A KeyWatcher (jetstream.KeyValue.Watch) survives the outage but is blind
// for a while after it: its ordered consumer lived in the old server's
// memory, and nats.go recreates it, from the revision after the last one
// delivered, only when a heartbeat check (every 10s, two missed 5s idle
// heartbeats; neither is configurable for KV watchers) finds no activity
// while connected. Updates made after Up thus reach the old watcher 10 to
// 20s later (measured: 19.7s after a short outage); then they all arrive,
// in order, none lost or repeated. For the gateway's "enforced within 2s"
// a kept watcher is not enough: on every reconnect (nats.ReconnectHandler),
// Stop the watcher and watch again with
// jetstream.ResumeFromRevision(last applied + 1), which delivered the
// missed updates within a millisecond. The Updates channel is not closed by
// an outage; it closes only on Stop or when the connection is closed.
//
// A KV put while the server is down fails (context deadline), but nats.go
// keeps the message in its reconnect buffer (ReconnectBufSize, 8MB by
// default) and sends it on reconnect, so the put is applied although the
// caller got an error. A writer that must know (the operator API) should
// either connect with nats.ReconnectBufSize(-1), which fails such a put at
// once with "outbound buffer limit exceeded" and does not apply it, or
// write with kv.Update and the expected revision, so a replayed write
// cannot overwrite a newer one.
package natsserver
