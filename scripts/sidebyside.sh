#!/usr/bin/env bash
# sidebyside.sh: the gateway beside envoyproxy/ratelimit under the same
# Envoy RLS load, in one run (loadtest/cmd/sidebyside).
#
#   scripts/sidebyside.sh [sidebyside flags...]      e.g. -rounds 5 -duration 15s
#
# envoyproxy/ratelimit is built from its public repository into a temporary
# directory, never into this repository: from $RATELIMIT_SRC (a checkout)
# when set, else cloned from $RATELIMIT_GIT (default: the local mirror
# /work/.mirror/envoyproxy+ratelimit/repo when present, else
# https://github.com/envoyproxy/ratelimit). $RATELIMIT_BIN skips the build
# and uses that binary. The gateway and the harness are built with go build.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-sidebyside.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

bin=${RATELIMIT_BIN:-}
if [[ -z "$bin" ]]; then
	src=${RATELIMIT_SRC:-}
	if [[ -z "$src" ]]; then
		git_url=${RATELIMIT_GIT:-}
		if [[ -z "$git_url" ]]; then
			if [[ -d /work/.mirror/envoyproxy+ratelimit/repo ]]; then
				git_url=/work/.mirror/envoyproxy+ratelimit/repo
			else
				git_url=https://github.com/envoyproxy/ratelimit
			fi
		fi
		echo "sidebyside: cloning envoyproxy/ratelimit from $git_url" >&2
		git clone -q --depth 1 "$git_url" "$tmp/ratelimit-src" 2>/dev/null || git clone -q "$git_url" "$tmp/ratelimit-src"
		src=$tmp/ratelimit-src
	fi
	echo "sidebyside: building envoyproxy/ratelimit ($(git -C "$src" log -1 --format=%h 2>/dev/null || echo unknown))" >&2
	(cd "$src" && go build -o "$tmp/ratelimit" ./src/service_cmd)
	bin=$tmp/ratelimit
fi
go build -o "$tmp/" ./gateway/cmd/gateway ./loadtest/cmd/sidebyside
"$tmp/sidebyside" -ratelimit "$bin" -gateway "$tmp/gateway" "$@"
