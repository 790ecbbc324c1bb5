// Package rules decodes, validates, compiles and matches Tollgate rulesets
// (configs/rules.yaml is an annotated example).
//
// A ruleset is a YAML (or JSON: JSON is YAML) document holding a key
// registry, tier patterns, an allowlist and a blocklist of key globs, route
// templates for endpoint normalisation, and the rules themselves. [Parse]
// decodes a document into a [Document], refusing unknown fields, wrong types
// and duplicate fields with the line they occur on; [Compile] validates a
// Document and turns it into an immutable [Ruleset]; [Load] does both. A
// ruleset that fails validation is refused as a whole: the error joins one
// [*ValidationError] per problem (up to a bound), each naming the rule and
// field, so callers can use errors.As and show every fault at once.
//
// A Ruleset is safe for concurrent use and is never modified; reload by
// compiling a new one and swapping it atomically (atomic.Pointer). Its
// request-path methods — [Ruleset.Identify], [Ruleset.Listed],
// [Ruleset.Normalize] and [Ruleset.Match] — do not allocate, nor does
// [CleanPath] for a path that is already normal.
//
// # Endpoints
//
// [CleanPath] normalises a request path (unreserved escapes
// decoded, dot segments removed, slashes merged; encoded slashes,
// backslashes and NULs and paths above the root refused), so that two
// spellings of one resource are one endpoint; [Ruleset.Normalize] then
// drops the trailing slash and applies the route templates. A request
// without a client IP matches no rule counted per IP (ip scope, and key or
// tenant scope for anonymous requests). [Ruleset.MatchBound] and
// [Ruleset.CheckMatchLimit] bound how many rules one request is certain to
// match.
//
// # Numbers
//
// Compiled parameters ([Params]) are exact integers: times in microseconds,
// and the full-refill time of the bucket algorithms as a reduced fraction.
// Decimal refill rates such as 0.5 are read as exact rationals, never as
// floats. Every number a Redis script has to handle is bounded by 2^52 so
// that Lua's doubles represent it exactly; a ruleset that would need more is
// refused.
//
// # Counter tags
//
// Every rule gets a short [Rule.Tag] derived from the rule part of its
// counter identity (id, algorithm, window, precision, scope, by_endpoint),
// never from its position, so inserting or reordering rules, or changing a
// limit or a rate, keeps every counter, while changing a rule's algorithm,
// window or precision starts fresh counters.
//
// # Credentials
//
// Raw API keys appear in a ruleset's registry and overrides. Error messages
// never print them in full: they show at most a short prefix.
//
// YAML anchors and aliases are refused: they are rarely needed in a ruleset
// and an alias can make a small document expand into a huge one.
package rules
