// Package apierror is Tollgate's vocabulary of API errors, written once for
// every HTTP surface: the guard's decisions and the HTTP middleware, the
// gateway's proxy, check API, forward auth and Envoy rate-limit service,
// and the aggregator's operator API and usage reports.
//
// It holds three things:
//
//   - the codes (RateLimitExceeded, NotFound, …) and the table of where
//     each is answered, with which HTTP status and when (Rows): the
//     reference's error tables are generated from it, and the house rules
//     refuse an error code written as a string literal anywhere else, or a
//     code answered with a status the table does not give it;
//   - the error body, {"error":{"code":…,"message":…}}, appended by
//     AppendBody or, with more members, AppendFields, and written to a
//     net/http response by Write;
//   - the JSON string escaper every hand-written JSON encoder of the module
//     uses, AppendString, which writes exactly what encoding/json writes.
//
// The appenders allocate nothing beyond growing the caller's buffer, so
// the data plane's answers stay free of allocations.
package apierror
