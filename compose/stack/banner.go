package stack

import (
	"fmt"
	"strings"

	"github.com/tollgate/tollgate/configs"
)

// RaiseSed is the sed expression of the banner's "raise a limit" line: it
// turns free-default's burst of 5 into 50 in the shipped
// configs/rules.yaml (the one line holding "capacity: 5 ").
const RaiseSed = `s/capacity: 5 /capacity: 50 /`

// printBanner writes what a newcomer needs once the stack is ready: the
// addresses, the secrets it generated and curl lines to try, the operator
// API's among them. The curl lines fit the shipped configs/rules.yaml.
func (s *Stack) printBanner() {
	a := s.addrs
	rulesFile := s.regions[0].rulesFile
	proxy := "http://" + dialable(a.Proxy)
	api := "http://" + dialable(a.API)
	metrics := "http://" + dialable(a.Metrics)

	var b strings.Builder
	line := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	redis := a.Redis + "  (redis-server)"
	if s.redisKind == BackendEmbedded {
		redis = a.Redis + "  (embedded stand-in for redis-server: fine to try, not to measure)"
	}

	line("")
	line("Tollgate is running. Ctrl-C stops it.")
	line("")
	line("  gateway proxy    %s  -> demo API http://%s", proxy, dialable(a.Demo))
	line("  check API        %s/v1/check", api)
	line("  metrics          %s/metrics  (also /healthz, /readyz)", metrics)
	line("  Envoy RLS gRPC   %s", dialable(a.GRPC))
	line("  redis            %s", redis)
	line("  kafka            %s  (embedded Kafka-protocol broker: topics %s, …)", dialable(a.Kafka), "tollgate.decisions.v1")
	line("  nats             %s  (embedded, JetStream on: KV buckets tollgate_rules, tollgate_blocklist, tollgate_overrides, tollgate_gateways)", a.NATS)
	line("  aggregator       http://%s  (usage reports, operator API /admin/v1/; bearer admin token)", dialable(a.Aggregator))
	line("  aggregator ops   http://%s/metrics  (also /healthz, /readyz)", dialable(a.AggregatorMetrics))
	line("  console          %s", s.console)
	line("                   open it to sign in as the admin (the link works once, within an hour); later, sign in with a token below")
	if s.cfg.EnvFile != "" && s.cfg.EnvFile != "off" {
		line("  join the stack   set -a; . %s; set +a   then bin/gateway or bin/aggregator (README: Joining the local stack)", s.cfg.EnvFile)
	}
	line("  rules            seeded from %s into NATS (bucket tollgate_rules); the operator API owns them now (below)", rulesFile)
	s.regionsBanner(line)
	line("")
	if s.genSecret {
		line("  key secret       %s", s.cfg.KeySecret)
		line("                   generated for this run; set %s to keep one", configs.EnvName("key_secret"))
	} else {
		line("  key secret       from %s", configs.EnvName("key_secret"))
	}
	if s.genToken {
		line("  admin token      %s", s.cfg.AdminToken)
		line("                   for the operator API and reports; set %s to keep one", configs.EnvName("admin_token"))
	} else {
		line("  admin token      %s  (from %s)", s.cfg.AdminToken, configs.EnvName("admin_token"))
	}
	if s.genViewer {
		line("  viewer token     %s", s.cfg.ViewerToken)
		line("                   read-only, for the console and the operator API's reads; set %s to keep one", configs.EnvName("viewer_token"))
	} else {
		line("  viewer token     %s  (from %s)", s.cfg.ViewerToken, configs.EnvName("viewer_token"))
	}
	line("")
	line("Try it:")
	line("")
	line("  # Passes, with the rate-limit headers (sk_prod_acme_1: pro tier, tenant acme):")
	line("  curl -i -H 'X-API-Key: sk_prod_acme_1' %s/v1/users/42", proxy)
	line("")
	line("  # The demo key's bucket (rule free-default) holds 5 requests and refills one every 12 s:")
	line("  # five 200s, then 429 with Retry-After; wait that long and it passes again.")
	line("  for i in 1 2 3 4 5 6; do")
	line("    curl -s -o /dev/null -D - -H 'X-API-Key: sk_free_demo' %s/v1/users/42 | grep -iE '^(HTTP/|Retry-After:)'", proxy)
	line("  done")
	line("")
	line("  # The check API, for gateways in other languages. With the same key, endpoint and")
	line("  # client IP it shares the proxy's counters, so after the loop above this is a 429 too;")
	line("  # without \"ip\" no per-IP rule applies (anonymous requests need it to be limited):")
	line(`  curl -s -X POST %s/v1/check -d '{"api_key":"sk_free_demo","endpoint":"/v1/users/42","method":"GET","ip":"127.0.0.1"}'`, api)
	line("")
	line("  # A slow upstream answer (the demo API waits ms milliseconds, at most 10000):")
	line("  curl -s -H 'X-API-Key: sk_prod_acme_1' '%s/v1/slow?ms=250'", proxy)
	line("")
	agg := "http://" + dialable(a.Aggregator)
	line("  # Usage of tenant acme, per minute, from the decision stream (Kafka -> aggregator):")
	line("  curl -s -H 'Authorization: Bearer %s' '%s/v1/usage/tenants/acme?granularity=minute'", s.cfg.AdminToken, agg)
	line("")
	auth := "Authorization: Bearer " + s.cfg.AdminToken
	line("  # The control plane: the operator API writes NATS KV and every gateway applies the change at once.")
	line("  # Raise free-default's burst from 5 to 50: the demo key spent 5 above, so 45 are left at once")
	line("  # (a raised limit keeps what was consumed), and its next request passes:")
	line("  sed '%s' %s | curl -s -X PUT -H '%s' --data-binary @- %s/admin/v1/rules", RaiseSed, rulesFile, auth, agg)
	line("  curl -s -o /dev/null -w '%%{http_code}\\n' -H 'X-API-Key: sk_free_demo' %s/v1/users/42", proxy)
	line("")
	line("  # Block the demo key for 10 minutes: 403 KEY_BLOCKED on every gateway, answered without Redis:")
	line(`  curl -s -X PUT -H '%s' -d '{"ttl":"10m","reason":"demo"}' %s/admin/v1/blocklist/sk_free_demo`, auth, agg)
	line("  curl -s -o /dev/null -w '%%{http_code}\\n' -H 'X-API-Key: sk_free_demo' %s/v1/users/42", proxy)
	line("")
	line("  # The audit log: who changed what, when (the seeding from %s, then the two changes above):", rulesFile)
	line("  curl -s -H '%s' %s/admin/v1/audit", auth, agg)
	line("")
	line("  # Decisions so far, by rule and route (all metrics: %s/metrics):", metrics)
	line("  curl -s %s/metrics | grep '^tollgate_checks_total'", metrics)
	line("")
	s.regionsTry(line)
	_, _ = fmt.Fprint(s.out, b.String())
}

// GlobalDemoKey is the key of the shipped rules' world-demo rule, one
// limit for every region together, which the banner of a stack of several
// regions sends to each region in turn.
const GlobalDemoKey = "sk_world_demo"

// regionsBanner writes the addresses of the regions past the first, their
// links and join files, when the stack runs several.
func (s *Stack) regionsBanner(line func(string, ...any)) {
	if len(s.regions) < 2 {
		return
	}
	var names []string
	for _, r := range s.regions {
		names = append(names, r.name)
	}
	line("")
	line("  regions          %s, each its own Redis, Kafka, NATS (JetStream domain of its name), aggregator and gateway;", strings.Join(names, ", "))
	line("                   the addresses above are r1's. The NATS servers are linked by leafnode connections, r1 the hub,")
	line("                   each region's through its link (a TCP proxy: GET / its state, POST /latency?ms=N, /cut, /heal).")
	for _, r := range s.regions {
		line("  %-16s proxy http://%s  check API http://%s  aggregator http://%s", r.name, dialable(r.addrs.Proxy), dialable(r.addrs.API), dialable(r.addrs.Aggregator))
		line("  %-16s nats %s  link http://%s", "", r.addrs.NATS, r.link.ControlAddr())
		if s.cfg.EnvFile != "" && s.cfg.EnvFile != "off" {
			line("  %-16s join it: set -a; . %s; set +a", "", RegionEnvFile(s.cfg.EnvFile, r.name))
		}
	}
}

// regionsTry writes the banner's curl lines about regions, when the stack
// runs several.
func (s *Stack) regionsTry(line func(string, ...any)) {
	if len(s.regions) < 2 {
		return
	}
	var proxies []string
	for _, r := range s.regions {
		proxies = append(proxies, "http://"+dialable(r.addrs.Proxy))
	}
	last := s.regions[len(s.regions)-1]
	line("  # Regions: %s holds one limit for every region together (rule world-demo, 10 a minute), each region", GlobalDemoKey)
	line("  # its share (%d regions: equal shares). Rotating between the regions' proxies, it gets 10 in all, not 10 each:", len(s.regions))
	line("  for i in 1 2 3 4 5 6 7 8; do for p in %s; do", strings.Join(proxies, " "))
	line("    curl -s -o /dev/null -w '%%{http_code} ' -H 'X-API-Key: %s' $p/v1/users/42", GlobalDemoKey)
	line("  done; done; echo")
	line("")
	line("  # Cut %s's link to the other regions: each region goes on deciding alone, within its share; then heal it:", last.name)
	line("  curl -s -X POST http://%s/cut", last.link.ControlAddr())
	line("  curl -s -X POST http://%s/heal", last.link.ControlAddr())
	line("")
}
