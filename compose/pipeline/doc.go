// Package pipeline holds the end-to-end tests of the decision pipeline
// (docs/aggregator.md): real gateways (in process, and as child processes that
// are SIGKILLed), the embedded Kafka-protocol broker taken down and brought
// back, a real redis-server and an aggregator; the per-tenant usage report
// must equal the decisions the gateways made, to the request.
//
//	go test ./compose/pipeline -run TestKafkaOutage -outage=30s -v
//
// measures the "Kafka down 30 s under load" figure of docs/benchmarks.md, and
//
//	go test ./compose/pipeline -run '^$' -bench FleetScale -benchtime 50x -timeout 15m
//
// rule and blocklist propagation to 10, 50 and 200 in-process gateways on
// one NATS server. The fleet tests (TestFleet…, TestLadderEndToEnd) run
// gateways in fleet mode against the aggregator's operator API, NATS KV
// and, for the penalty ladder, the decision stream: what crosses from the
// control plane to the data plane is tested here, so that neither
// process's package imports the other, even in its tests.
package pipeline
