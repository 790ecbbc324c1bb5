package tollgatev1_test

import (
	"hash/fnv"
	"testing"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// TestPartitionOfIsFNV1a checks PartitionOf against the standard library's
// FNV-1a: gateways and the aggregator must agree on it byte for byte.
func TestPartitionOfIsFNV1a(t *testing.T) {
	t.Parallel()
	for _, n := range []int32{1, 6, 7, 64, 1000} {
		for _, tenant := range []string{"", "acme", "tenant-1", "é", "kid_0123456789abcdefghij", "\xff\x00"} {
			h := fnv.New32a()
			_, _ = h.Write([]byte(tenant))
			if got, want := tollgatev1.PartitionOf(tenant, n), int32(h.Sum32()%uint32(n)); got != want {
				t.Errorf("PartitionOf(%q, %d) = %d, want %d", tenant, n, got, want)
			}
		}
	}
}
