// Package houserules holds Tollgate's house rules as a test, in the manner of
// pebble's internal/lint: `go test ./internal/houserules` walks every Go
// package of the module and fails on
//
//   - a package named util, utils, common, helpers, helper or misc: name a
//     package for what it provides;
//   - time.Sleep in a _test.go file: wait with internal/testwait.Eventually
//     or another deadline-polling loop;
//   - the global loggers in a library package, that is any non-main
//     package: slog.Info, slog.Default, slog.SetDefault, log.Printf and the
//     like; take a *slog.Logger instead (nil: discard);
//   - a package without a package comment: add a doc.go starting
//     "// Package name ...";
//   - a function or method longer than 150 lines (func line to closing
//     brace) outside tests and generated code: split it into steps;
//   - in non-test code, a default given when a value is zero as a block,
//     `if x == 0 { x = d }` (or "" for a string) with d a constant, a name
//     or a field: write `x = cmp.Or(x, d)` (a d with a call stays a block,
//     since cmp.Or evaluates every argument);
//   - in non-test code, an API error code written as a string literal
//     outside guard/apierror (alone, or inside a JSON fragment such as
//     `"code":"PENALTY"`), a code-shaped literal answered as a code that
//     is not in its table, or a code answered with an HTTP status its
//     table does not give it: every surface answers from that one table
//     (tests spell the wire as it is);
//   - in non-test code, an import that runs back up the floors
//     (importRules): guard imports nothing of compose, loadtest, aggregator
//     or gateway; schemas nothing of Tollgate's; gateway and aggregator not
//     each other (nor loadtest); compose/internal/lifecycle, the one
//     lifecycle of the starters, none of the starters built on it. A tool
//     that needs both the library and the starters lives under
//     loadtest/cmd.
//
// It also reads every file git tracks (docs, READMEs, comments, --help
// texts, configs, scripts, test messages) and fails on a citation of a
// document that is not in the repository — the product contract or the
// dependency notes the project is built from, by name — or of an issue
// number: users cannot follow them, so say the fact, or link the doc in
// docs/ that holds it.
//
// Exceptions live in allowlists in the tests, sleepAllowlist, docAllowlist,
// longFuncAllowlist, errorCodeAllowlist and citationAllowlist; each entry
// says why, and a stale entry fails the test.
//
// Directories named testdata or vendor, or starting with "." or "_", and
// nested modules are not checked. The package has no exported API.
package houserules
