// Package deploy holds no code: it is the home of the tests that keep the
// production-like deployment in this directory honest, since no
// Docker engine runs where they do.
//
//   - compose_test.go reads docker-compose.yml, the Dockerfile and the
//     Prometheus, Alertmanager, Grafana and Redis files beside it: every
//     TOLLGATE_* variable exists (gateway.Vars, aggregator.Vars) and its
//     service's configuration loads, every host:port names a service and a
//     port it exposes, every image is pinned, every mounted file exists.
//   - dashboards_test.go checks the Grafana dashboards' structure: the
//     provisioned datasource, panel layout, template variables.
//   - rules_test.go runs promtool check rules and promtool test rules on
//     prometheus/alerts.yml (cases in prometheus/alerts_test.yml) and
//     checks every alert is tested firing and quiet.
//   - live_test.go starts a Redis, an in-process Kafka broker, a NATS
//     server, two gateways and an aggregator configured from
//     docker-compose.yml, sends traffic (a penalty among it), lints their
//     /metrics with promtool check metrics, runs a real prometheus on
//     prometheus/prometheus.yml and evaluates every dashboard query against
//     it: a query that returns nothing fails the test.
//   - regions_test.go reads the two-region deployment (docker-compose.yml
//     with docker-compose.regions.yml, merged as docker compose merges
//     them; the checks of compose_test.go run on it too): the NATS
//     configuration files under nats/ parse with nats-server's own parser
//     and link the regions' JetStream domains hub and spoke, each region's
//     services use their own NATS, Redis and Kafka, regions/rules.yaml is
//     configs/rules.yaml with the regions listed. regions_live_test.go
//     starts the two NATS servers from those files and checks they link.
//
// The tests need promtool and prometheus (Debian package prometheus; make
// deps installs it) and fail, never skip, without them.
package deploy
