// Package report records the answers of a load-test run and renders them:
// counts per outcome, an HDR latency histogram with microsecond resolution,
// the same second by second ([Second]), a one-line progress report, and the
// end-of-run [Summary] as text, JSON, or a self-contained HTML page with
// charts ([Summary.WriteHTML]) to which a scenario adds its own ([Chart]).
//
// # Charts
//
// The page draws its charts with github.com/go-analyze/charts, which
// renders SVG on the server: the page has no script and loads nothing, so a
// report opens offline, in CI without a network, and in anything that
// shows SVG. The alternatives weighed:
//
//   - github.com/wcharczuk/go-chart/v2, the usual server-side SVG choice,
//     was archived by its author in 2024. go-analyze/charts is its
//     maintained continuation (go-chart lives on as its chartdraw
//     package), released often, with stacked areas and themes. MIT.
//   - github.com/go-echarts/go-echarts/v2 is well kept, but draws in the
//     browser with echarts: about 1 MB of JavaScript to embed in the binary
//     and inline in every page, for interaction these charts do not need.
//   - gonum.org/v1/plot is well kept and draws SVG too, but brings font,
//     LaTeX and PDF packages along, and stacked areas would be drawn by
//     hand.
//
// go-analyze/charts depends on freetype and x/image, to measure text, and
// two small packages of its author's. It embeds the fonts it measures
// labels with, Roboto and Noto Sans (open font licences, Apache 2.0 and SIL
// OFL 1.1, which allow shipping them in a binary), about 1 MB of the
// loadtest binary. The page asks for Roboto, then fonts of about its width,
// so that labels keep the room measured for them.
package report
