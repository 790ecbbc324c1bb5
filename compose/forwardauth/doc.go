// Package forwardauth proves the shipped forward-auth configurations
// (configs/nginx/tollgate.conf and configs/caddy/Caddyfile) with the real
// servers: its tests start nginx and Caddy from the Debian packages (make
// deps installs them), a gateway in process with its check API's
// /v1/authz, a Redis and an upstream, all on free loopback ports, and
// check what a client sees: 200s with the rate-limit headers, then a 429
// with an honest Retry-After and the JSON body; a blocked key's 403; the
// client IP from the proxy's X-Forwarded-For only when the proxy is
// trusted; and the upstream still served when the gateway is gone (fail
// open).
//
// The tests run the shipped files, with only their addresses, port and
// token replaced, so a change to them is tested. A missing nginx or caddy
// binary fails the tests with the command that installs it; it never
// skips them. Debian ships no Traefik, so configs/traefik is only decoded
// with Traefik's field names and checked for the headers it must pass on.
// The package has no code besides its tests.
package forwardauth
