#!/usr/bin/env bash
# checkvsrls.sh: gateway CPU per decision of the check API (POST /v1/check)
# beside Envoy RLS, in one run (the target: the check API at most the RLS
# figure). Each gateway binary given gets a redis-server of its own and the
# side-by-side run's limit (fixed_window, 1000 per hour per key: no
# rejections); the load is bin/loadtest's, 50 closed-loop workers, 10,000
# uniform keys (each target its own, so neither finds the other's leases).
# Round by round, every gateway is measured on grpc then
# check, the order of the gateways and of the two targets alternating from
# one round to the next, after one warm-up run of each.
#
#   scripts/checkvsrls.sh [-rounds N] [-duration D] [-env K=V,...] GATEWAY_BIN...
#   e.g. make build && scripts/checkvsrls.sh -rounds 3 -duration 15s bin/gateway
#
# Two binaries (say one built from main) give a same-run A/B. -env adds
# settings to every gateway (-env TOLLGATE_FAST_PATH_DISABLED=true).
# Output: one line per run: gateway, round, target, decisions/s, gateway
# CPU per decision, Redis calls (EVALSHA) per decision.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3 duration=15s extra=""
while [[ $# -gt 0 ]]; do
	case $1 in
	-rounds) rounds=$2; shift 2 ;;
	-duration) duration=$2; shift 2 ;;
	-env) extra=$2; shift 2 ;;
	*) break ;;
	esac
done
[[ $# -ge 1 ]] || { echo "usage: $0 [-rounds N] [-duration D] [-env K=V,...] GATEWAY_BIN..." >&2; exit 2; }
loadtest=${LOADTEST:-bin/loadtest}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tollgate-checkvsrls.XXXXXX")
pids=()
cleanup() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
	wait 2>/dev/null || true
	rm -rf "$tmp"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
cat >"$tmp/rules.yaml" <<'YAML'
rules:
  - {id: under, match: {}, algorithm: fixed_window, limit: 1000, window: 1h}
YAML

declare -a gw_pid gw_api gw_grpc gw_redis
n=0
for bin in "$@"; do
	rport=$(free_port)
	redis-server --port "$rport" --bind 127.0.0.1 --save '' --appendonly no >"$tmp/redis$n.log" 2>&1 &
	pids+=($!)
	api=$(free_port) grpc=$(free_port)
	env_extra=()
	[[ -n $extra ]] && IFS=, read -ra env_extra <<<"$extra"
	env TOLLGATE_KEY_SECRET=checkvsrls-secret-0123456789 TOLLGATE_RULES_FILE="$tmp/rules.yaml" \
		TOLLGATE_REDIS_ADDRS=127.0.0.1:$rport TOLLGATE_GRPC_LISTEN=127.0.0.1:$grpc \
		TOLLGATE_API_LISTEN=127.0.0.1:$api TOLLGATE_METRICS_LISTEN=off TOLLGATE_LOG_LEVEL=warn \
		TOLLGATE_GATEWAY_ID=gw$n TOLLGATE_DATA_DIR="$tmp/data$n" "${env_extra[@]}" \
		"$bin" >"$tmp/gateway$n.log" 2>&1 &
	pids+=($!)
	gw_pid[n]=$! gw_api[n]=$api gw_grpc[n]=$grpc gw_redis[n]=$rport
	n=$((n + 1))
done
sleep 2

run() { # run GW TARGET DURATION
	local i=$1 t=$2 d=$3 target
	if [[ $t == grpc ]]; then target=(-target grpc -addr "127.0.0.1:${gw_grpc[i]}"); else target=(-target check -url "http://127.0.0.1:${gw_api[i]}/v1/check"); fi
	"$loadtest" "${target[@]}" -workers 50 -keys 10000 -key-prefix "sk_${t}_" -paths /v1/items -duration "$d" \
		-pid "${gw_pid[i]}" -redis "127.0.0.1:${gw_redis[i]}" -quiet 2>&1
}
for i in $(seq 0 $((n - 1))); do
	run "$i" grpc 5s >/dev/null
	run "$i" check 5s >/dev/null
done
for r in $(seq 1 "$rounds"); do
	order=$(seq 0 $((n - 1)))
	targets="grpc check"
	if ((r % 2 == 0)); then order=$(seq $((n - 1)) -1 0); targets="check grpc"; fi
	for i in $order; do
		for t in $targets; do
			out=$(run "$i" "$t" "$duration")
			rate=$(awk '/^throughput/ {print $2}' <<<"$out")
			cpu=$(sed -n 's/.*CPU, \([0-9.]*\) µs CPU per decision.*/\1/p' <<<"$out")
			evals=$(sed -n 's/.*, \([0-9.]*\) EVALSHA per decision.*/\1/p' <<<"$out")
			printf '%s\tround %d\t%-5s\t%8.0f/s\t%6s µs/decision\t%s EVALSHA/decision\n' "${*:i+1:1}" "$r" "$t" "$rate" "$cpu" "$evals"
		done
	done
done
