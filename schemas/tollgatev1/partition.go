package tollgatev1

// PartitionOf is the partition of a tenant's decision events among n
// partitions of TopicDecisions: fnv32a(tenant) mod n. Gateways partition
// by it, and the aggregator's operator API sends a key's commands (a
// penalty lift) to the same partition, so the one owner of the tenant's
// state applies them in order. Anonymous requests (tenant "") all go to
// PartitionOf("", n). n must be positive. It does not allocate.
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
