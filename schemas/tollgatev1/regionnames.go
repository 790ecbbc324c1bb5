package tollgatev1

// SubjectRegionUsage is the core NATS subject on which region's
// aggregators answer another region's global usage report (request and
// reply; the request and the reply are JSON). One aggregator of the region
// answers each request (a queue group).
func SubjectRegionUsage(region string) string { return "tollgate.region." + region + ".usage" }

// QueueRegionUsage is the queue group of SubjectRegionUsage's responders.
const QueueRegionUsage = "tollgate-aggregators"
