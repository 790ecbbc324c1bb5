package report

import (
	"bytes"
	"html"
	"math"
	"strings"
	"testing"
)

// testSummary is a summary of a made-up run of 5.2 s: 2xx and 429
// answers, one second without answers, a last second of 0.2 s.
func testSummary() *Summary {
	s := &Summary{
		Target: "proxy", Endpoint: "http://127.0.0.1:8080", Mode: "closed", Workers: 4,
		StoppedBy: "duration", ElapsedSeconds: 5.2, Sent: 1200, Answered: 1190, Errors: 10,
		Statuses: map[string]int64{"2xx": 900, "429": 290, "5xx": 0}, LatencyFrom: "sent",
		LatencyUS: Latency{Count: 1190, P50: 850, P99: 4200, Max: 9000},
		Order:     []string{"2xx", "429", "5xx"},
	}
	for i := range 5 {
		sec := Second{Start: float64(i), Span: 1, Counts: []int64{180, 58, 0}, Errors: 2, P50: 850, P99: 4200}
		if i == 2 {
			sec = Second{Start: 2, Span: 1, Counts: make([]int64, 3)}
		}
		s.Seconds = append(s.Seconds, sec)
	}
	s.Seconds = append(s.Seconds, Second{Start: 5, Span: 0.2, Counts: []int64{10, 0, 0}, P50: 900, P99: 900})
	return s
}

func TestWriteHTML(t *testing.T) {
	t.Parallel()
	s := testSummary()
	s.AddChart(Chart{
		Title: "Admitted <vs> the model", YTitle: "admitted", X: []float64{1, 2, 3},
		Series: []Series{{Name: "admitted", Values: []float64{1, 2, 3}}, {Name: "model", Values: []float64{1, math.NaN(), 3}, Color: "#123456"}},
	})
	var b bytes.Buffer
	if err := s.WriteHTML(&b); err != nil {
		t.Fatal(err)
	}
	page := b.String()
	for _, id := range []string{"chart-throughput", "chart-latency", "chart-outcomes", "chart-extra-1"} {
		if !strings.Contains(page, `id="`+id+`"`) {
			t.Errorf("page lacks the figure %s", id)
		}
	}
	if n := strings.Count(page, "<svg"); n != 4 {
		t.Errorf("%d svg elements, want 4", n)
	}
	// The table shows what the text summary shows.
	for _, l := range s.lines() {
		if !strings.Contains(page, "<th>"+l.label+"</th><td>"+html.EscapeString(l.text)+"</td>") {
			t.Errorf("page lacks the summary line %s %q", l.label, l.text)
		}
	}
	// Titles are escaped; the page loads nothing.
	if !strings.Contains(page, "Admitted &lt;vs&gt; the model") {
		t.Error("the added chart's title is missing or not escaped")
	}
	for _, bad := range []string{"<script", "src=", "href=", "url(", "@import"} {
		if strings.Contains(page, bad) {
			t.Errorf("page holds %q", bad)
		}
	}
	// The last second, 0.2 s long, is left out of the run's charts (5
	// points each), outcomes without answers too.
	if strings.Contains(page, ">5.2<") {
		t.Error("the short last second is charted")
	}
	if strings.Contains(page, ">5xx<") {
		t.Error("an outcome without answers is charted")
	}
	for _, want := range []string{">2xx<", ">429<", ">errors<", ">errors/s<", "rgb(18,52,86)"} {
		if !strings.Contains(page, want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

func TestWriteHTMLWithoutSeconds(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name    string
		seconds []Second
		note    bool
	}{
		{"none", nil, false},
		{"one and a short one", []Second{{Span: 1, Counts: []int64{1, 0, 0}}, {Start: 1, Span: 0.1, Counts: []int64{1, 0, 0}}}, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := testSummary()
			s.Seconds = tt.seconds
			var b bytes.Buffer
			if err := s.WriteHTML(&b); err != nil {
				t.Fatal(err)
			}
			if strings.Contains(b.String(), "<svg") || !strings.Contains(b.String(), "<table") {
				t.Error("want the table and no chart")
			}
			if got := strings.Contains(b.String(), "too short to chart"); got != tt.note {
				t.Errorf("note shown: %v, want %v", got, tt.note)
			}
		})
	}
}

func TestWriteHTMLRefusesBadCharts(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		chart Chart
		want  string
	}{
		{"no title", Chart{X: []float64{1}, Series: []Series{{Name: "a", Values: []float64{1}}}}, "needs a title"},
		{"no points", Chart{Title: "t", Series: []Series{{Name: "a"}}}, "has no points"},
		{"no series", Chart{Title: "t", X: []float64{1}}, "has no series"},
		{"unnamed", Chart{Title: "t", X: []float64{1}, Series: []Series{{Values: []float64{1}}}}, "has no name"},
		{"short", Chart{Title: "t", X: []float64{1, 2}, Series: []Series{{Name: "a", Values: []float64{1}}}}, "1 values for 2 points"},
		{"color", Chart{Title: "t", X: []float64{1}, Series: []Series{{Name: "a", Values: []float64{1}, Color: "red"}}}, "not #rrggbb"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := testSummary()
			s.AddChart(tt.chart)
			var b bytes.Buffer
			err := s.WriteHTML(&b)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("WriteHTML = %v, want an error saying %q", err, tt.want)
			}
			if b.Len() != 0 {
				t.Error("WriteHTML wrote a page despite the error")
			}
		})
	}
}

func TestExtraLinesAndTables(t *testing.T) {
	t.Parallel()
	s := testSummary()
	s.Extra = []Line{{Label: "invariant 1", Text: "held: <strict>"}}
	s.Tables = []Table{{Title: "Faults", Header: []string{"#", "kind"}, Rows: [][]string{{"1", "gw-kill"}, {"2", "a<b"}}}}
	var text, page bytes.Buffer
	if err := s.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "held: <strict>") {
		t.Errorf("text lacks the extra line:\n%s", text.String())
	}
	if err := s.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"<th>invariant 1</th><td>held: &lt;strict&gt;</td>", "<caption>Faults</caption>",
		"<th>#</th><th>kind</th>", "<td>1</td><td>gw-kill</td>", "<td>2</td><td>a&lt;b</td>"} {
		if !strings.Contains(page.String(), want) {
			t.Errorf("page lacks %q", want)
		}
	}
}

// svgTexts returns the text elements of an SVG, in order.
func svgTexts(svg string) []string {
	var out []string
	for _, part := range strings.Split(svg, "</text>")[:max(strings.Count(svg, "</text>"), 0)] {
		out = append(out, html.UnescapeString(part[strings.LastIndex(part, ">")+1:]))
	}
	return out
}

// TestXLabels: x labels stand at round seconds, the same for every chart
// of a run, and a short last second gets none to crowd its neighbour's.
func TestXLabels(t *testing.T) {
	t.Parallel()
	seconds := func(n int, last float64) []float64 {
		var x []float64
		for i := 1; i <= n; i++ {
			x = append(x, float64(i))
		}
		if last > 0 {
			x = append(x, last)
		}
		return x
	}
	for _, tt := range []struct {
		name string
		x    []float64
		want string // the non-blank labels
	}{
		{"ten seconds", seconds(10, 0), "1 2 3 4 5 6 7 8 9 10"},
		{"ten and a short last", seconds(10, 10.4), "1 2 3 4 5 6 7 8 9 10"},
		{"a storm of 41.54 s", seconds(41, 41.54), "5 10 15 20 25 30 35 40"},
		{"three minutes", seconds(180, 180.3), "15 30 45 60 75 90 105 120 135 150 165 180"},
		{"half seconds", []float64{0.5, 1, 1.5, 2, 2.5, 3}, "1 2 3"},
		{"one point", []float64{7}, "7"},
	} {
		var got []string
		for _, l := range xLabels(tt.x) {
			if l != "" {
				got = append(got, l)
			}
		}
		if strings.Join(got, " ") != tt.want {
			t.Errorf("%s: labels %q, want %s", tt.name, got, tt.want)
		}
	}
}

// TestChartAxes: a chart of whole numbers (a penalty level) labels its y
// axis 0, 1, 2, 3 and nothing between, and the SVG's x labels are xLabels'.
func TestChartAxes(t *testing.T) {
	t.Parallel()
	x := make([]float64, 41)
	levels := make([]float64, 41)
	for i := range x {
		x[i], levels[i] = float64(i+1), float64(min(i/8, 3))
	}
	x[40] = 40.54
	svg, err := renderSVG(Chart{Title: "Level", YTitle: "level", X: x, YMax: 3, YLabels: 4,
		Series: []Series{{Name: "gateway", Values: levels}}})
	if err != nil {
		t.Fatal(err)
	}
	texts := strings.Join(svgTexts(svg), " ")
	if want := "gateway level 3 2 1 0 seconds since the start 5 10 15 20 25 30 35 40"; texts != want {
		t.Errorf("texts of the chart: %q, want %q", texts, want)
	}
}

// TestSummaryKeysLine: one key is "1 key", not "1 one key".
func TestSummaryKeysLine(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		keys, paths int
		dist, want  string
	}{
		{1000, 2, "zipf", "1000 keys zipf, 2 paths, cost 1"},
		{1, 1, "", "1 key, 1 path, cost 1"},
		{1, 1, "uniform", "1 key, 1 path, cost 1"},
	} {
		s := &Summary{Keys: tt.keys, Paths: tt.paths, Dist: tt.dist, Cost: 1}
		for _, l := range s.lines() {
			if l.label == "keys" && l.text != tt.want {
				t.Errorf("keys line %q, want %q", l.text, tt.want)
			}
		}
	}
}
