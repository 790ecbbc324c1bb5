// Package forwardauth proves the shipped forward-auth configurations
// (configs/nginx/tollgate.conf, configs/caddy/Caddyfile and
// configs/traefik) with the real servers: its tests start nginx and Caddy
// from the Debian packages (make deps installs them) and Traefik built from
// its source through the Go module proxy by make traefik (cached under the
// user's cache directory), a gateway in process with its check
// API's /v1/authz, a Redis and an upstream, all on free loopback ports, and
// check what a client sees: 200s with the rate-limit headers (Traefik hands
// them to the API instead), then a 429 with an honest Retry-After and the
// JSON body; a blocked key's 403; the client IP from the proxy's
// X-Forwarded-For only when the proxy is trusted; and the upstream still
// served when the gateway hangs or is gone (fail open).
//
// The tests run the shipped files, with only their addresses, port and
// token replaced, so a change to them is tested. A missing nginx or caddy
// binary fails the tests with the command that installs it; it never
// skips them. Traefik's build takes minutes, so make test does not run
// it: until make traefik has built it, its test is skipped, saying so; a
// build asked for that fails, fails the test in CI (CI=true). The package has no code besides
// its tests.
package forwardauth
