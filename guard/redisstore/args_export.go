package redisstore

import (
	"fmt"
	"strconv"

	"github.com/tollgate/tollgate/guard"
)

// ScriptCall returns, as strings, the KEYS and ARGV that Do sends with
// EVALSHA (script SHA: DecideScript().SHA) when it decides op on counters,
// with time taken from Redis TIME and this store's TTL margin. The counters
// must share one Cluster slot, as one script call's do. It lets a guard call
// be replayed by hand (redis-cli EVALSHA) or by redis-benchmark, which is how
// the SPEC §8 throughput ratio is measured. The slices are new on every call.
func (s *Store) ScriptCall(op guard.Op, counters []guard.Counter) (keys, args []string) {
	keys, av := buildArgs(op, 0, s.margin, counters)
	args = make([]string, len(av))
	for i, v := range av {
		switch v := v.(type) {
		case int64:
			args[i] = strconv.FormatInt(v, 10)
		case string:
			args[i] = v
		default:
			args[i] = fmt.Sprint(v)
		}
	}
	return keys, args
}
