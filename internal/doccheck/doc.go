// Package doccheck holds the tests that keep the documentation true to the
// build. They read README.md, docs/ and every README.md of the repository,
// and fail when
//
//   - a documented TOLLGATE_* variable is one no binary or tool reads
//     (configs.Registry, configs.Tools);
//   - an endpoint the gateway or the aggregator serves is missing from
//     docs/reference/endpoints.md, or a documented Tollgate endpoint is not
//     served (the routes are read from the servers' source: the patterns
//     given to their muxes, and the check API's paths);
//   - a flag of a command is missing from docs/reference/commands.md, or a
//     command line in the docs uses a flag the command does not define (the
//     flags are read from the commands' source: their flag sets);
//   - a field of an event message is missing from docs/reference/events.md;
//   - a tollgate_* name (a metric, a KV bucket) in the docs is not in the
//     code;
//   - a relative link or an anchor in the docs leads nowhere.
//
// The package has no non-test code.
package doccheck
