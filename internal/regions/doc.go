// Package regions is the protocol that keeps one global limit across
// several regions: each region admits against its own share of the limit in
// its own Redis, never calling another region on the request path, and
// unused units move between regions as loans that expire. docs/regions.md
// is the design and the argument that the fleet never admits more than one
// region alone would admit for the whole limit; this package is that
// design as code, without NATS or Redis: time is passed in (microseconds of
// the caller's clock, the region's Redis clock in production) and messages
// go out through a Transport the caller provides.
//
// The parts:
//
//   - Limit, Fleet and StaticShares: a global rule's limit as the protocol
//     sees it (three kinds: fixed windows, sliding windows, buckets), the
//     regions with their weights, and each region's static share of a
//     limit (largest-remainder rounding, so no unit is stranded).
//   - Store is the region's side of a share in its Redis: give units
//     (only what it has not used, removed atomically before anything is
//     sent), receive them (each loan at most once), and report a counter's
//     state. Ledger is the exact in-memory implementation: the reference
//     the Redis scripts must match, and what the simulation runs. Ledger
//     also decides admissions (Admit) as the gateways' scripts will.
//   - Region is a region's agent: it counts demand from the decisions,
//     reports the hot counters to the coordinator once per period, carries
//     out the coordinator's orders through its Store and applies the loans
//     other regions send it. It refuses orders of a deposed coordinator.
//   - Coordinator plans, once per period, where units should be: targets
//     from the regions' demand, loans from the regions below their targets
//     to those above, extensions of the loans still wanted. It is not
//     needed for safety: whatever it orders, a region gives only units it
//     has removed, and a loan is applied once and expires.
//
// Nothing here starts a goroutine or takes a lock: a Ledger, a Region and a
// Coordinator are each owned by one loop that calls them in turn (in
// production the region's aggregator; in tests the simulation in package
// regionsim).
package regions
