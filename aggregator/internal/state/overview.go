package state

import (
	"bytes"
	"fmt"

	"github.com/cockroachdb/pebble/v2"

	"github.com/tollgate/tollgate/aggregator/internal/abuse"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
)

// KeyTotal is one key's decisions in a span of minute windows, summed
// over its endpoints and partitions.
type KeyTotal struct {
	Tenant, KeyID, KeyPrefix string
	Allowed, Rejected        int64
}

// Recent sums, per (tenant, key_id), the minute rows of every tenant
// whose windows start in [from, to) (Unix seconds). It seeks tenant by
// tenant, so it reads the rows of the span and one key per tenant, not
// the whole history.
func (d *DB) Recent(from, to int64) ([]KeyTotal, error) {
	it, err := d.db.NewIter(&pebble.IterOptions{LowerBound: []byte{spaceRow}, UpperBound: []byte{spaceRow + 1}})
	if err != nil {
		return nil, fmt.Errorf("state: recent rows: %w", err)
	}
	defer it.Close()
	var out []KeyTotal
	index := map[[2]string]int{}
	for valid := it.First(); valid; {
		r := reader{b: it.Key()[1:]}
		tenant := r.string()
		if err := r.err(); err != nil {
			return nil, err
		}
		prefix := tenantPrefix(tenant, windows.Minute)
		for valid = it.SeekGE(appendInt64(bytes.Clone(prefix), from)); valid && bytes.HasPrefix(it.Key(), prefix); valid = it.Next() {
			rk, err := DecodeRowKey(it.Key())
			if err != nil {
				return nil, err
			}
			if rk.Start >= to {
				break
			}
			r, err := DecodeRowValue(it.Value())
			if err != nil {
				return nil, err
			}
			id := [2]string{rk.Tenant, rk.KeyID}
			i, ok := index[id]
			if !ok {
				i = len(out)
				index[id] = i
				out = append(out, KeyTotal{Tenant: rk.Tenant, KeyID: rk.KeyID, KeyPrefix: r.KeyPrefix})
			}
			out[i].Allowed = windows.AddSat(out[i].Allowed, r.Allowed)
			out[i].Rejected = windows.AddSat(out[i].Rejected, r.Rejected)
		}
		valid = it.SeekGE(prefixEnd(appendString([]byte{spaceRow}, tenant)))
	}
	return out, it.Error()
}

// EachPenalty calls fn with every key's penalty state held, partition by
// partition, until fn returns an error.
func (d *DB) EachPenalty(fn func(p int32, keyID string, s abuse.State) error) error {
	return d.scan([]byte{spacePenalty}, []byte{spacePenalty + 1}, func(k, v []byte) error {
		p, id, err := DecodePenaltyKey(k)
		if err != nil {
			return err
		}
		s, err := DecodePenaltyValue(v)
		if err != nil {
			return err
		}
		return fn(p, id, s)
	})
}
