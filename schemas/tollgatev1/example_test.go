package tollgatev1_test

import (
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/tollgate/tollgate/schemas/tollgatev1"
)

// A record on TopicUsage holds one UsageRollup in the Protocol Buffers binary
// encoding: the aggregator marshals it, and a consumer unmarshals each
// record's value.
func ExampleUsageRollup() {
	// The aggregator's side.
	value, err := proto.Marshal(&tollgatev1.UsageRollup{
		Tenant:          "acme",
		KeyId:           "k_3f9a1c",
		KeyPrefix:       "tg_live_ab12",
		Endpoint:        "/v1/users/{id}",
		Granularity:     tollgatev1.Granularity_GRANULARITY_MINUTE,
		WindowStartUnix: 1767225600, // 2026-01-01T00:00:00Z
		WindowSeconds:   60,
		Allowed:         118,
		Rejected:        7,
		Cost:            121,
		RulesHit:        []string{"per-key", "tenant-burst"},
		Revision:        1,
		ClosedAtUnix:    1767225670,
	})
	if err != nil {
		fmt.Println("marshal:", err)
		return
	}

	// The consumer's side: record.Value from a read_committed reader.
	var row tollgatev1.UsageRollup
	if err := proto.Unmarshal(value, &row); err != nil {
		fmt.Println("unmarshal:", err)
		return
	}
	start := time.Unix(row.GetWindowStartUnix(), 0).UTC()
	fmt.Println(row.GetTenant(), row.GetKeyId(), row.GetKeyPrefix(), row.GetEndpoint())
	fmt.Println(row.GetGranularity(), start.Format(time.RFC3339), start.Add(time.Duration(row.GetWindowSeconds())*time.Second).Format(time.RFC3339))
	fmt.Printf("allowed=%d rejected=%d cost=%d rules=%v revision=%d\n",
		row.GetAllowed(), row.GetRejected(), row.GetCost(), row.GetRulesHit(), row.GetRevision())
	// Output:
	// acme k_3f9a1c tg_live_ab12 /v1/users/{id}
	// GRANULARITY_MINUTE 2026-01-01T00:00:00Z 2026-01-01T00:01:00Z
	// allowed=118 rejected=7 cost=121 rules=[per-key tenant-burst] revision=1
}
