// Package chaos is the chaos soak behind `loadtest chaos`
// (docs/reliability.md): it starts a fleet of real processes on loopback —
// Redis as Sentinel (compose/redisserver), the Kafka-protocol broker and
// NATS each in a process of its own (the hidden `loadtest chaos-child`),
// aggregators and gateways (bin/aggregator, bin/gateway) — with every link
// between them through a proxy it controls (package compose/linkproxy), drives
// open-loop load through the gateways' proxy, check API and Envoy RLS with
// operator changes as it goes, applies a seeded fault schedule ([Plan]),
// records what every client saw (package history), heals, settles and
// has package checker judge the history.
//
// [Run] runs one soak. It starts, for the run's length, a goroutine for
// the load and one per request in flight, one per polite client, one for
// the operator, one for the schedule and one per fault in force (its
// heal and the measure of its recovery), one monitor, and per child
// process one waiting for it; all have returned when Run returns. The
// proxies' goroutines are theirs (linkproxy.Listen) and are closed with
// the fleet.
package chaos
