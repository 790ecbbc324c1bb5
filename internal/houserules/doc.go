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
//     "// Package name ...".
//
// It also reads every file git tracks (docs, READMEs, comments, --help
// texts, configs, scripts, test messages) and fails on a citation of a
// document that is not in the repository — the product contract or the
// dependency notes the project is built from, by name — or of an issue
// number: users cannot follow them, so say the fact, or link the doc in
// docs/ that holds it.
//
// Exceptions live in allowlists in the tests, sleepAllowlist, docAllowlist
// and citationAllowlist; each entry says why, and a stale entry fails the
// test.
//
// Directories named testdata or vendor, or starting with "." or "_", and
// nested modules are not checked. The package has no exported API.
package houserules
