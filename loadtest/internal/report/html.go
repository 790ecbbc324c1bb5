package report

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"html/template"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/go-analyze/charts"
)

// Chart is one more chart for a report's page: one line per series over a
// shared x axis, or stacked areas. A scenario with an exact reference model
// adds one that sets what it admitted against what the model admits:
//
//	s.AddChart(report.Chart{
//		Title:  "Admitted vs the exact model",
//		YTitle: "requests admitted, cumulative",
//		X:      seconds, // 1, 2, 3, …
//		Series: []report.Series{
//			{Name: "admitted", Values: admitted},
//			{Name: "model", Values: model},
//		},
//	})
type Chart struct {
	// Title is shown above the chart; it must not be empty.
	Title string
	// XTitle names the x axis; empty: "seconds since the start".
	XTitle string
	// YTitle names the y axis, with its unit.
	YTitle string
	// X holds the x value of each point, in the order to draw them.
	X []float64
	// XNames, when set, labels every point (one name per X) and spaces
	// the points evenly whatever their x: an axis of categories, such as
	// key counts 1k, 100k, 1M, 10M drawn on a log scale. Empty: the axis
	// is numeric and labelled at round values of X.
	XNames []string
	// Series holds the lines, each with one value per X.
	Series []Series
	// Stacked draws each series as a filled area on top of the ones
	// before it, so the last shows the total.
	Stacked bool
	// YMax, when positive, is the top of the y axis, and YLabels, when
	// positive, its number of labels from 0 to YMax: an axis of whole
	// numbers, such as penalty levels 0–3 (YMax 3, YLabels 4). Zero: the
	// axis fits the values.
	YMax    float64
	YLabels int
}

// Series is one line of a Chart.
type Series struct {
	// Name labels the line in the legend; it must not be empty.
	Name string
	// Values holds one value per Chart.X; NaN leaves a gap.
	Values []float64
	// Color is the line's "#rrggbb"; empty: the next of the page's
	// palette.
	Color string
}

// AddChart adds c to the HTML page, after the charts of the run. c is
// checked when the page is written.
func (s *Summary) AddChart(c Chart) { s.Charts = append(s.Charts, c) }

// validate reports every problem with c at once.
func (c Chart) validate() error {
	var errs []error
	name := c.Title
	if name == "" {
		name = "untitled"
		errs = append(errs, errors.New("report: a chart needs a title"))
	}
	if len(c.X) == 0 {
		errs = append(errs, fmt.Errorf("report: chart %q has no points", name))
	}
	if len(c.Series) == 0 {
		errs = append(errs, fmt.Errorf("report: chart %q has no series", name))
	}
	if len(c.XNames) > 0 && len(c.XNames) != len(c.X) {
		errs = append(errs, fmt.Errorf("report: chart %q has %d x names for %d points", name, len(c.XNames), len(c.X)))
	}
	for i, sr := range c.Series {
		if sr.Name == "" {
			errs = append(errs, fmt.Errorf("report: chart %q: series %d has no name", name, i))
		}
		if len(sr.Values) != len(c.X) {
			errs = append(errs, fmt.Errorf("report: chart %q: series %q has %d values for %d points", name, sr.Name, len(sr.Values), len(c.X)))
		}
		if sr.Color != "" && !hexColor.MatchString(sr.Color) {
			errs = append(errs, fmt.Errorf("report: chart %q: series %q: color %q is not #rrggbb", name, sr.Name, sr.Color))
		}
	}
	return errors.Join(errs...)
}

var hexColor = regexp.MustCompile(`^#[0-9a-fA-F]{6}$`)

// Colors of the page. Each series of the run's charts has its own, so that
// a reader (and the test that looks at a screenshot) can tell them apart.
const (
	colorAnswers = "#3867d6" // throughput
	colorP50     = "#20a39e" // latency
	colorP99     = "#8e44ad"
	colorErrors  = "#2d3436" // no answer
)

// outcomeColors colors outcomes by name; other names get palette colors.
var outcomeColors = map[string]string{
	"2xx":                "#4caf50",
	"OK":                 "#4caf50",
	"429":                "#f39c12",
	"OVER_LIMIT":         "#f39c12",
	"429 PENALTY":        "#8e44ad",
	"OVER_LIMIT PENALTY": "#8e44ad",
	"403":                "#e74c3c",
	"403 PENALTY":        "#2c3e50",
	"400":                "#b2a91f",
	"4xx":                "#a0522d",
	"5xx":                "#c2185b",
	"UNKNOWN":            "#c2185b",
	"other":              "#95a5a6",
}

// palette colors, in turn, the series of a chart that name no color.
var palette = []string{"#e67e22", "#1e3799", "#16a085", "#c0392b", "#7f8c8d", "#6c5ce7"}

// Size of every chart, in SVG units; the page scales them to its width.
const (
	chartWidth  = 1200
	chartHeight = 330
)

// secondsTitle is the x axis of the run's charts.
const secondsTitle = "seconds since the start"

// WriteHTML writes s as one self-contained HTML page: the summary as a
// table (the figures of WriteText), then charts of the run second by
// second (throughput, p50 and p99 latency, outcomes stacked) when two
// seconds or more are left to chart, then the charts added with
// AddChart. Charts are inline SVG; the page has no scripts and loads
// nothing. Nothing is written when an added chart is not valid.
func (s *Summary) WriteHTML(w io.Writer) error {
	for _, c := range s.Charts {
		if err := c.validate(); err != nil {
			return err
		}
	}
	page := htmlPage{
		Title:     fmt.Sprintf("loadtest: %s %s", s.Target, s.Endpoint),
		Generated: s.generated(),
		Lines:     s.lines(),
		Tables:    s.Tables,
	}
	var figs []Chart
	if len(s.chartSeconds()) >= 2 {
		figs = append(figs, s.throughputChart(), s.latencyChart(), s.outcomesChart())
	} else if len(s.Seconds) > 0 {
		page.Note = "The run was too short to chart second by second."
	}
	ids := []string{"throughput", "latency", "outcomes"}
	for i, c := range append(figs, s.Charts...) {
		id := fmt.Sprintf("extra-%d", i-len(figs)+1)
		if i < len(figs) {
			id = ids[i]
		}
		svg, err := renderSVG(c)
		if err != nil {
			return fmt.Errorf("report: chart %q: %w", c.Title, err)
		}
		page.Figures = append(page.Figures, htmlFigure{ID: "chart-" + id, Title: c.Title, SVG: template.HTML(svg)})
	}
	var b bytes.Buffer
	if err := pageTemplate.Execute(&b, page); err != nil {
		return fmt.Errorf("report: html: %w", err)
	}
	_, err := w.Write(b.Bytes())
	return err
}

// generated returns the line under the page's heading: when it was
// written, how long the run lasted.
func (s *Summary) generated() string {
	return fmt.Sprintf("written %s; the run lasted %.1f s", time.Now().Format("2006-01-02 15:04:05 MST"), s.ElapsedSeconds)
}

// minLastSpan is the shortest last second the charts show: the answers of
// a shorter one (those in flight when the run ended, say) are too few for
// a rate or percentiles that mean anything. They still count in the
// summary.
const minLastSpan = 0.25

// chartSeconds returns the seconds the charts show: s.Seconds, without a
// last one shorter than minLastSpan.
func (s *Summary) chartSeconds() []Second {
	secs := s.Seconds
	if n := len(secs); n > 1 && secs[n-1].Span < minLastSpan {
		secs = secs[:n-1]
	}
	return secs
}

// ChartX returns the x values of the run's charts, seconds since the
// start: the end of each second charted (the last may be shorter), nil
// when the run is too short to chart. A chart added with AddChart over
// the same x gets the same ticks as the run's.
func (s *Summary) ChartX() []float64 {
	secs := s.chartSeconds()
	if len(secs) < 2 {
		return nil
	}
	return secondsX(secs)
}

// secondsX returns the x values of the run's charts: the end of each
// second (the last may be shorter).
func secondsX(secs []Second) []float64 {
	x := make([]float64, len(secs))
	for i, sec := range secs {
		x[i] = math.Round((sec.Start+sec.Span)*100) / 100
	}
	return x
}

// throughputChart plots answers per second, and errors per second when
// there were any.
func (s *Summary) throughputChart() Chart {
	secs := s.chartSeconds()
	answers := make([]float64, len(secs))
	errs := make([]float64, len(secs))
	var anyErr bool
	for i, sec := range secs {
		answers[i] = float64(sec.Answered()) / sec.Span
		errs[i] = float64(sec.Errors) / sec.Span
		anyErr = anyErr || sec.Errors > 0
	}
	c := Chart{
		Title: "Throughput", YTitle: "per second", X: secondsX(secs),
		Series: []Series{{Name: "answers/s", Values: answers, Color: colorAnswers}},
	}
	if anyErr {
		c.Series = append(c.Series, Series{Name: "errors/s", Values: errs, Color: colorErrors})
	}
	return c
}

// latencyChart plots each second's p50 and p99 in milliseconds; a second
// without answers is a gap.
func (s *Summary) latencyChart() Chart {
	secs := s.chartSeconds()
	p50 := make([]float64, len(secs))
	p99 := make([]float64, len(secs))
	for i, sec := range secs {
		p50[i], p99[i] = math.NaN(), math.NaN()
		if sec.Answered() > 0 {
			p50[i], p99[i] = float64(sec.P50)/1e3, float64(sec.P99)/1e3
		}
	}
	return Chart{
		Title: fmt.Sprintf("Latency from %s time", s.LatencyFrom), YTitle: "ms", X: secondsX(secs),
		Series: []Series{
			{Name: "p50", Values: p50, Color: colorP50},
			{Name: "p99", Values: p99, Color: colorP99},
		},
	}
}

// outcomesChart stacks the answers per second of every outcome the run
// saw (Seconds' Counts follow Order), and the errors.
func (s *Summary) outcomesChart() Chart {
	secs := s.chartSeconds()
	c := Chart{Title: "Outcomes", YTitle: "per second, stacked", X: secondsX(secs), Stacked: true}
	for i, name := range s.Order {
		if s.Statuses[name] == 0 || i >= len(secs[0].Counts) {
			continue
		}
		v := make([]float64, len(secs))
		for j, sec := range secs {
			v[j] = float64(sec.Counts[i]) / sec.Span
		}
		c.Series = append(c.Series, Series{Name: name, Values: v, Color: outcomeColors[name]})
	}
	if s.Errors > 0 {
		v := make([]float64, len(secs))
		for j, sec := range secs {
			v[j] = float64(sec.Errors) / sec.Span
		}
		c.Series = append(c.Series, Series{Name: "errors", Values: v, Color: colorErrors})
	}
	if len(c.Series) == 0 { // nothing answered: draw the empty answers
		c.Series = []Series{{Name: "answers", Values: make([]float64, len(secs)), Color: colorAnswers}}
	}
	return c
}

// renderSVG draws c as an SVG element.
func renderSVG(c Chart) (string, error) {
	values := make([][]float64, len(c.Series))
	names := make([]string, len(c.Series))
	colors := make([]charts.Color, len(c.Series))
	next := 0
	for i, sr := range c.Series {
		names[i] = sr.Name
		values[i] = make([]float64, len(sr.Values))
		for j, v := range sr.Values {
			if math.IsNaN(v) || math.IsInf(v, 0) {
				v = charts.GetNullValue()
			}
			values[i][j] = v
		}
		color := sr.Color
		if color == "" {
			color = palette[next%len(palette)]
			next++
		}
		colors[i] = charts.ParseColor(color)
	}
	labels := xLabels(c.X)
	if len(c.XNames) > 0 {
		labels = c.XNames
	}
	xTitle := cmp.Or(c.XTitle, secondsTitle)
	opt := charts.NewLineChartOptionWithData(values)
	opt.Theme = charts.GetDefaultTheme().WithSeriesColors(colors)
	opt.Padding = charts.Box{Top: 16, Right: 24, Bottom: 8, Left: 12}
	opt.Legend.SeriesNames = names
	opt.Legend.Offset = charts.OffsetRight
	opt.XAxis.Labels = labels
	opt.XAxis.Title = xTitle
	opt.XAxis.BoundaryGap = charts.Ptr(false)
	// Every label is a tick to the chart library; xLabels left the ones
	// between the chosen ticks blank.
	opt.XAxis.LabelCount = len(labels)
	y := charts.YAxisOption{Title: c.YTitle, Min: charts.Ptr(0.0)}
	if c.YMax > 0 {
		y.Max = charts.Ptr(c.YMax)
	}
	if c.YLabels > 0 {
		y.LabelCount = c.YLabels
		y.PreferNiceIntervals = charts.Ptr(false)
	}
	opt.YAxis = []charts.YAxisOption{y}
	opt.Symbol.Shape = charts.SymbolNone
	opt.LineStrokeWidth = 2
	if c.Stacked {
		opt.StackSeries = charts.Ptr(true)
		opt.FillOpacity = 150
	}
	p := charts.NewPainter(charts.PainterOptions{
		OutputFormat: charts.ChartOutputSVG,
		Width:        chartWidth,
		Height:       chartHeight,
	})
	if err := p.LineChart(opt); err != nil {
		return "", err
	}
	b, err := p.Bytes()
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// maxXLabels bounds the labels of an x axis.
const maxXLabels = 12

// xSteps are the distances between x labels xLabels chooses from, in the
// x axis's unit (seconds): the smallest that keeps to maxXLabels.
var xSteps = []float64{1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600}

// xLabels returns the labels of the points x: the first point at or past
// each multiple of a step (1, 2, 5, 10, … chosen from the range of x, at
// most maxXLabels labels) is labelled with its x, every other point is
// blank. So charts with the same x get the same ticks whatever they plot,
// labels stand at round values, and a short last second (x = 41.54, say)
// gets no label of its own to crowd its neighbour's.
func xLabels(x []float64) []string {
	labels := make([]string, len(x))
	if len(x) == 0 {
		return labels
	}
	lo, hi := x[0], x[len(x)-1]
	step := xSteps[len(xSteps)-1]
	for _, s := range xSteps {
		if (hi-lo)/s < maxXLabels {
			step = s
			break
		}
	}
	next := math.Ceil(lo/step) * step
	for i, v := range x {
		if math.IsNaN(v) || v < next {
			continue
		}
		labels[i] = strconv.FormatFloat(v, 'f', -1, 64)
		if len(labels[i]) > 8 {
			labels[i] = strconv.FormatFloat(v, 'g', 4, 64)
		}
		next = (math.Floor(v/step) + 1) * step
	}
	return labels
}

type htmlPage struct {
	Title, Generated, Note string
	Lines                  []summaryLine
	Tables                 []Table
	Figures                []htmlFigure
}

type htmlFigure struct {
	ID, Title string
	SVG       template.HTML
}

// pageTemplate is the page. Its styles are inline and it links nothing.
var pageTemplate = template.Must(template.New("page").Funcs(template.FuncMap{
	"label": func(l summaryLine) string { return l.label },
	"text":  func(l summaryLine) string { return l.text },
}).Parse(`<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="tollgate loadtest">
<title>{{.Title}}</title>
<style>
body { font: 15px/1.45 Roboto, "Helvetica Neue", Arial, "DejaVu Sans", sans-serif; color: #222; margin: 24px auto; max-width: 1240px; padding: 0 16px; }
h1 { font-size: 22px; margin: 0 0 2px; }
p.generated { color: #666; margin: 0 0 14px; }
p.note { color: #666; }
table.summary { border-collapse: collapse; margin-bottom: 18px; font-family: "DejaVu Sans Mono", Menlo, Consolas, monospace; font-size: 13px; }
table.summary th { text-align: left; padding: 2px 16px 2px 0; color: #555; font-weight: normal; vertical-align: top; }
table.summary td { padding: 2px 0; }
figure.chart { margin: 0 0 14px; border: 1px solid #c9d1d9; border-radius: 4px; padding: 8px 8px 4px; }
figure.chart figcaption { font-weight: bold; margin: 0 0 2px 6px; }
figure.chart svg { display: block; width: 100%; height: auto; }
table.data { border-collapse: collapse; margin: 0 0 18px; font-size: 13px; }
table.data caption { text-align: left; font-weight: bold; margin-bottom: 4px; }
table.data th, table.data td { border: 1px solid #d0d7de; padding: 2px 8px; text-align: left; vertical-align: top; }
table.data th { background: #f6f8fa; }
/* The charts measure their labels with Roboto; where it is missing, fonts of about its width. */
figure.chart svg text { font-family: Roboto, "Helvetica Neue", Arial, "Liberation Sans", "DejaVu Sans Condensed", sans-serif !important; }
</style>
</head>
<body>
<h1>{{.Title}}</h1>
<p class="generated">{{.Generated}}</p>
<table class="summary">
{{range .Lines}}<tr><th>{{label .}}</th><td>{{text .}}</td></tr>
{{end}}</table>
{{with .Note}}<p class="note">{{.}}</p>
{{end}}{{range .Tables}}<table class="data">
<caption>{{.Title}}</caption>
<tr>{{range .Header}}<th>{{.}}</th>{{end}}</tr>
{{range .Rows}}<tr>{{range .}}<td>{{.}}</td>{{end}}</tr>
{{end}}</table>
{{end}}{{range .Figures}}<figure class="chart" id="{{.ID}}">
<figcaption>{{.Title}}</figcaption>
{{.SVG}}
</figure>
{{end}}</body>
</html>
`))
