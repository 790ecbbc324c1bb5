#!/usr/bin/env bash
# install-deps.sh makes sure this machine has what `make test` needs besides
# Go: redis-server, redis-cli and redis-benchmark (Debian package
# redis-server; tests spawn redis-server on ephemeral ports), a C compiler
# (go test -race needs cgo), protoc (Debian package protobuf-compiler;
# make generate and the staleness test of schemas/tollgatev1 run it), and
# promtool and prometheus (Debian package prometheus; the tests of
# compose/deploy lint metrics, unit-test the alert rules and evaluate every
# dashboard query against a real Prometheus they start on a free port),
# Chromium (Debian package chromium; the loadtest report test opens its
# HTML page in headless Chromium), nginx and caddy (Debian packages;
# compose/forwardauth runs the shipped forward-auth configurations with them),
# and curl (compose/stack runs the README's curl lines against the stack).
#
# Where systemd runs, Debian's package also starts its own prometheus
# service on :9090; the tests do not use it (sudo systemctl disable --now
# prometheus stops it for good).
#
# Idempotent: when everything is present it only reports versions. When
# something is missing and apt-get exists, it installs it if it can without a
# password (running as root, as CI does, or with passwordless sudo);
# otherwise it stops at once and prints the exact command to run.
#
# Environment:
#   TOLLGATE_REDIS_SERVER  a redis-server binary to use instead of PATH's
#   TOLLGATE_CHROMIUM      a Chromium binary to use instead of PATH's chromium
#   TOLLGATE_NO_INSTALL=1  never install, only check
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }

missing=()    # what is absent, for the message
packages=()   # Debian packages that provide it

redis_server="${TOLLGATE_REDIS_SERVER:-redis-server}"
if ! have "$redis_server" || ! have redis-cli || ! have redis-benchmark; then
	have "$redis_server" || missing+=("$redis_server")
	have redis-cli || missing+=(redis-cli)
	have redis-benchmark || missing+=(redis-benchmark)
	packages+=(redis-server)
fi

# Debian installs nginx in /usr/sbin, which a user's PATH may lack.
have_sbin() { have "$1" || [ -x "/usr/sbin/$1" ]; }
for proxy in nginx caddy; do
	if ! have_sbin "$proxy"; then
		missing+=("$proxy")
		packages+=("$proxy")
	fi
done

cc="$(go env CC 2>/dev/null || true)"
cc="${cc%% *}"
if ! have "${cc:-gcc}"; then
	missing+=("${cc:-gcc} (C compiler for go test -race)")
	packages+=(gcc libc6-dev)
fi

if ! have protoc; then
	missing+=(protoc)
	packages+=(protobuf-compiler)
fi

if ! have promtool || ! have prometheus; then
	have promtool || missing+=(promtool)
	have prometheus || missing+=(prometheus)
	packages+=(prometheus)
fi

chromium="${TOLLGATE_CHROMIUM:-chromium}"
if ! have "$chromium"; then
	missing+=("$chromium (headless browser for the loadtest report test)")
	packages+=(chromium)
fi

if ! have curl; then
	missing+=("curl (the README walkthrough test runs the README's curl lines)")
	packages+=(curl)
fi

report() {
	echo "deps: redis-server $("$redis_server" --version | sed -n 's/.*v=\([^ ]*\).*/\1/p') at $(command -v "$redis_server")"
	echo "deps: $(redis-cli --version), $(redis-benchmark --version 2>/dev/null || echo 'redis-benchmark present')"
	echo "deps: protoc $(protoc --version | sed 's/^libprotoc //') at $(command -v protoc)"
	echo "deps: prometheus $(prometheus --version 2>&1 | sed -n 's/^prometheus, version \([^ ]*\).*/\1/p') and promtool at $(command -v promtool)"
	echo "deps: $("$chromium" --version 2>/dev/null || echo chromium) at $(command -v "$chromium")"
	echo "deps: $( (nginx -v || /usr/sbin/nginx -v) 2>&1 | head -n 1), caddy $(caddy version 2>/dev/null | head -n 1)"
}

if [ ${#missing[@]} -eq 0 ]; then
	report
	exit 0
fi

cmd="apt-get update && apt-get install -y ${packages[*]}"
echo "deps: missing: ${missing[*]}" >&2

sudo=""
can_install=false
if [ "${TOLLGATE_NO_INSTALL:-}" != 1 ] && have apt-get; then
	if [ "$(id -u)" -eq 0 ]; then
		can_install=true
	elif have sudo && sudo -n true 2>/dev/null; then
		can_install=true
		sudo="sudo -n"
	fi
fi

if ! $can_install; then
	{
		echo "deps: cannot install without a password here. Run:"
		if have apt-get; then
			echo "    sudo apt-get update && sudo apt-get install -y ${packages[*]}"
			echo "  (as root: $cmd)"
		else
			echo "    install redis-server, redis-cli and redis-benchmark (Redis 7), nginx, caddy, protoc,"
			echo "    prometheus, promtool and Chromium with your package manager, or point"
			echo "    TOLLGATE_REDIS_SERVER and TOLLGATE_CHROMIUM at their binaries"
		fi
		echo "then run make again."
	} >&2
	exit 1
fi

echo "deps: installing ${packages[*]}: ${sudo:+$sudo }$cmd"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${packages[@]}"

for bin in "$redis_server" redis-cli redis-benchmark nginx caddy "${cc:-gcc}" protoc promtool prometheus "$chromium"; do
	if ! have_sbin "$bin"; then
		echo "deps: $bin still missing after installing ${packages[*]}" >&2
		exit 1
	fi
done
report
