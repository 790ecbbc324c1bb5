#!/usr/bin/env bash
# fuzz.sh runs every Go fuzz target of the module, one after another, each
# for FUZZTIME (default 10s). Targets are found with `go test -list '^Fuzz'`,
# so new ones are picked up without editing this file.
#
# Usage: scripts/fuzz.sh [packages...]   (default ./...)
set -euo pipefail

fuzztime="${FUZZTIME:-10s}"
go="${GO:-go}"
pkgs=("$@")
[ ${#pkgs[@]} -gt 0 ] || pkgs=(./...)

# `go test -list` prints a package's matching names, then "ok  <pkg> <time>".
mapfile -t targets < <("$go" test -list '^Fuzz' "${pkgs[@]}" | awk '
	/^Fuzz/ { names[n++] = $1; next }
	/^ok / { for (i = 0; i < n; i++) print $2, names[i]; n = 0 }
')

if [ ${#targets[@]} -eq 0 ]; then
	echo "fuzz: no fuzz targets in ${pkgs[*]} yet"
	exit 0
fi

echo "fuzz: ${#targets[@]} target(s), ${fuzztime} each"
for t in "${targets[@]}"; do
	pkg="${t% *}"
	name="${t#* }"
	echo "fuzz: $pkg $name"
	"$go" test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" "$pkg"
done
