// Package regionsim is a deterministic simulation of the regions protocol
// (package regions): several regions, each with its ledger (its Redis), its
// agent and possibly a coordinator, on clocks that differ by up to the skew
// bound, exchanging messages over a network that loses, delays, duplicates
// and reorders them, is cut by partitions (symmetric and one-way), and
// whose processes crash. Requests arrive as Poisson streams per counter.
//
// Everything runs on one goroutine from one seeded random source and one
// event queue ordered by (true time, sequence), so a seed replays exactly.
// A region's ledger is the in-memory regions.Ledger unless Options.Ledger
// provides another (guard/redisstore/regionstore runs one region's in a
// real Redis this way).
//
// After every step the simulation asserts the invariant in true time, for
// the counter the step touched:
//
//   - every admission is charged to a judge holding the whole limit as one
//     region alone would (a fixed window: the units admitted in each window
//     of true time ≤ L; a sliding window: in every trailing window ≤ L; a
//     bucket: over any interval T, ≤ C + R·T), and the first admission the
//     judge cannot take stops the run with an error naming it;
//   - the shares the regions hold at that instant, each read on its own
//     clock, sum to at most L (a fixed window: per window, over the regions
//     counting in it).
//
// It also keeps what the liveness figures need: a reference limiter per
// counter (one region alone with the whole limit, in true time) to count
// false rejections, the messages that cross regions, and each region's
// share and the coordinator's targets on demand.
package regionsim
