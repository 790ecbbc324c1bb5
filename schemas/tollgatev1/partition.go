package tollgatev1

// PartitionOf is the partition of TopicDecisions that carries a tenant's
// records, among n partitions: fnv32a(tenant) mod n (FNV-1a, 32 bits, of the
// tenant's bytes). Gateways write a tenant's decisions there, and the
// aggregator writes its command records (KIND_PENALTY_LIFT) there, so one
// owner sees them in order. A key without a tenant is its own tenant (its
// key_id); anonymous requests (tenant "") all go to PartitionOf("", n). n
// must be positive.
func PartitionOf(tenant string, n int32) int32 {
	const (
		offset32 = 2166136261
		prime32  = 16777619
	)
	h := uint32(offset32)
	for i := 0; i < len(tenant); i++ {
		h ^= uint32(tenant[i])
		h *= prime32
	}
	return int32(h % uint32(n))
}
