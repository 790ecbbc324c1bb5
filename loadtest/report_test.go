package loadtest

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/html"

	"github.com/tollgate/tollgate/internal/chromium"
	"github.com/tollgate/tollgate/loadtest/internal/testtarget"
)

// TestReportDrawsInChromium runs a short open-loop load against a target
// that admits a fixed number of requests a second and refuses one key in
// ten, writes the run's HTML report with an "admitted vs model" chart
// added, opens it in headless Chromium and checks that every chart drew:
// in the DOM Chromium built, each chart holds lines of several points that
// are not flat; in the screenshot, each chart's box is not blank and shows
// the color of each of its lines.
func TestReportDrawsInChromium(t *testing.T) {
	t.Parallel()
	chromium.Path(t) // before the run: a missing browser fails at once

	const perSecond = 300
	start := time.Now()
	var mu sync.Mutex
	var window, admitted int64 // guarded by mu
	srv := testtarget.StartHTTP(t, func(w http.ResponseWriter, _ *http.Request, key string, _ int64) {
		if strings.HasSuffix(key, "7") {
			w.WriteHeader(http.StatusForbidden)
			return
		}
		win := int64(time.Since(start) / time.Second)
		mu.Lock()
		if win != window {
			window, admitted = win, 0
		}
		ok := admitted < perSecond
		if ok {
			admitted++
		}
		mu.Unlock()
		if !ok {
			w.WriteHeader(http.StatusTooManyRequests)
		}
	})
	cfg := DefaultConfig()
	cfg.URL = srv.URL
	cfg.Rate = 1200
	cfg.Duration = 4 * time.Second
	cfg.Keys = 20
	s, err := Run(t.Context(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Seconds) < 4 {
		t.Fatalf("%d seconds recorded in a 4 s run", len(s.Seconds))
	}

	// What a scenario with a reference model adds: admitted so far, each
	// second, against the model. This model, a burst of 100 then perSecond
	// a second, is not what the target does, so that the two lines stay
	// apart in the screenshot.
	var x, got, model []float64
	var sum float64
	for _, sec := range s.Seconds {
		end := math.Round((sec.Start+sec.Span)*100) / 100
		sum += float64(sec.Counts[0]) // 2xx
		x = append(x, end)
		got = append(got, sum)
		model = append(model, 100+perSecond*end)
	}
	s.AddChart(Chart{
		Title: "Admitted vs the model", YTitle: "admitted, cumulative", X: x,
		Series: []Series{{Name: "admitted", Values: got}, {Name: "model", Values: model}},
	})
	file := filepath.Join(t.TempDir(), "report.html")
	var page bytes.Buffer
	if err := s.WriteHTML(&page); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, page.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	checkSelfContained(t, page.String())

	loaded := chromium.Load(t, file, 1280, 2000)
	if dir := os.Getenv("TOLLGATE_TEST_REPORT_DIR"); dir != "" { // to look at them
		var shot bytes.Buffer
		if err := png.Encode(&shot, loaded.Screenshot); err != nil {
			t.Fatal(err)
		}
		for name, b := range map[string][]byte{"report.html": page.Bytes(), "report.png": shot.Bytes()} {
			if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	charts := chartsInDOM(t, loaded.DOM)
	var ids []string
	for _, c := range charts {
		ids = append(ids, c.id)
	}
	if want := "chart-throughput chart-latency chart-outcomes chart-extra-1"; strings.Join(ids, " ") != want {
		t.Fatalf("charts in the DOM: %v, want %s", ids, want)
	}
	boxes := chartBoxes(loaded.Screenshot)
	if len(boxes) != len(charts) {
		t.Fatalf("found %d chart boxes in the screenshot (%v), want %d", len(boxes), boxes, len(charts))
	}
	for i, c := range charts {
		checkDrawn(t, c, loaded.Screenshot, boxes[i])
	}
}

// checkSelfContained fails t if page could load anything: a report opens
// offline.
func checkSelfContained(t *testing.T, page string) {
	t.Helper()
	for _, bad := range []string{"<script", "src=", "href=", "url(", "@import", "<link", "<iframe", "<object"} {
		if strings.Contains(page, bad) {
			t.Errorf("the page holds %q: it must load nothing", bad)
		}
	}
}

// domChart is a chart as Chromium's DOM has it.
type domChart struct {
	id    string
	lines []domShape // SVG paths with a stroke and no fill: the series' lines
	areas []domShape // paths with a fill and no stroke: stacked series' areas
}

// domShape is one drawn series: the color its pixels have on a white
// background, and its points.
type domShape struct {
	color  color.RGBA
	points int
}

var (
	strokeRGB = regexp.MustCompile(`stroke:rgb\((\d+),(\d+),(\d+)\)`)
	fillRGBA  = regexp.MustCompile(`stroke:none;fill:rgba\((\d+),(\d+),(\d+),([\d.]+)\)`)
)

// chartsInDOM returns the charts of the page in order, and fails t if one
// has no svg, or no line of at least 3 points with one above the x axis.
func chartsInDOM(t *testing.T, dom string) []domChart {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(dom))
	if err != nil {
		t.Fatalf("parse the DOM: %v", err)
	}
	var out []domChart
	for n := range doc.Descendants() {
		if n.Type != html.ElementNode || n.Data != "figure" || attr(n, "class") != "chart" {
			continue
		}
		c := domChart{id: attr(n, "id")}
		svgs := 0
		axis := math.Inf(-1)   // the x axis: the lowest long horizontal line
		var lineYs [][]float64 // of each line
		for m := range n.Descendants() {
			if m.Type != html.ElementNode {
				continue
			}
			if m.Data == "svg" {
				svgs++
			}
			if m.Data != "path" {
				continue
			}
			style, pts := attr(m, "style"), pathPoints(attr(m, "d"))
			if rgb := strokeRGB.FindStringSubmatch(style); rgb != nil && strings.Contains(style, "fill:none") {
				switch {
				case len(pts) == 2 && pts[0][1] == pts[1][1] && math.Abs(pts[1][0]-pts[0][0]) > 200:
					axis = math.Max(axis, pts[0][1])
				case len(pts) >= 3:
					c.lines = append(c.lines, domShape{rgba(rgb[1:4], 1), len(pts)})
					ys := make([]float64, len(pts))
					for i, p := range pts {
						ys[i] = p[1]
					}
					lineYs = append(lineYs, ys)
				}
			}
			if f := fillRGBA.FindStringSubmatch(style); f != nil && len(pts) >= 3 {
				alpha, _ := strconv.ParseFloat(f[4], 64)
				c.areas = append(c.areas, domShape{rgba(f[1:4], alpha), len(pts)})
			}
		}
		if svgs != 1 {
			t.Errorf("%s: %d svg elements, want 1", c.id, svgs)
		}
		drew := false
		for _, ys := range lineYs {
			for _, y := range ys {
				drew = drew || y < axis-1
			}
		}
		if !drew {
			t.Errorf("%s: no line of 3 points or more with a point above the x axis (y %v): lines %+v", c.id, axis, c.lines)
		}
		out = append(out, c)
	}
	return out
}

// rgba returns the color that r, g, b (decimal strings) at alpha show on
// white.
func rgba(rgb []string, alpha float64) color.RGBA {
	var c [3]uint8
	for i, v := range rgb {
		n, _ := strconv.Atoi(v)
		c[i] = uint8(math.Round(float64(n)*alpha + 255*(1-alpha)))
	}
	return color.RGBA{c[0], c[1], c[2], 255}
}

// attr returns n's attribute key, "" if it has none.
func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

// pathPoints returns the points of an SVG path made of M and L commands
// with absolute coordinates.
func pathPoints(d string) [][2]float64 {
	var pts [][2]float64
	f := strings.Fields(d)
	for i := 0; i+2 < len(f); i++ {
		if f[i] != "M" && f[i] != "L" {
			continue
		}
		x, errX := strconv.ParseFloat(f[i+1], 64)
		y, errY := strconv.ParseFloat(f[i+2], 64)
		if errX == nil && errY == nil {
			pts = append(pts, [2]float64{x, y})
		}
	}
	return pts
}

// chartBorder is the color of a chart's box (figure.chart's border).
var chartBorder = color.RGBA{0xc9, 0xd1, 0xd9, 0xff}

// chartBoxes finds the charts' boxes in a screenshot, top to bottom: rows
// where the border color runs across most of the width are the top and
// bottom edges.
func chartBoxes(img image.Image) []image.Rectangle {
	b := img.Bounds()
	type edge struct{ y, x0, x1 int }
	var edges []edge
	for y := b.Min.Y; y < b.Max.Y; y++ {
		n, x0, x1 := 0, -1, -1
		for x := b.Min.X; x < b.Max.X; x++ {
			if near(img.At(x, y), chartBorder, 12) {
				n++
				if x0 < 0 {
					x0 = x
				}
				x1 = x
			}
		}
		if n < b.Dx()*3/4 {
			continue
		}
		if k := len(edges); k > 0 && edges[k-1].y == y-1 {
			continue // the same edge, two pixels thick
		}
		edges = append(edges, edge{y, x0, x1})
	}
	var boxes []image.Rectangle
	for i := 0; i+1 < len(edges); i += 2 {
		top, bottom := edges[i], edges[i+1]
		boxes = append(boxes, image.Rect(top.x0+2, top.y+2, top.x1-1, bottom.y-1))
	}
	return boxes
}

// checkDrawn fails t unless box of img, the screenshot of chart c, is not
// blank and shows the color of each of c's series: its line's, or for
// stacked areas its area's (the next area covers part of a line).
func checkDrawn(t *testing.T, c domChart, img image.Image, box image.Rectangle) {
	t.Helper()
	series := c.lines
	if len(c.areas) > 0 {
		series = c.areas
	}
	if len(series) == 0 {
		t.Errorf("%s: the DOM has no series to look for in the screenshot", c.id)
	}
	var inked, total int
	var sum, sumSq float64
	seen := make([]int, len(series))
	for y := box.Min.Y; y < box.Max.Y; y++ {
		for x := box.Min.X; x < box.Max.X; x++ {
			px := img.At(x, y)
			r, g, b, _ := px.RGBA()
			lum := (0.299*float64(r) + 0.587*float64(g) + 0.114*float64(b)) / 257
			sum += lum
			sumSq += lum * lum
			total++
			if lum < 235 {
				inked++
			}
			for i, sr := range series {
				if near(px, sr.color, 24) {
					seen[i]++
				}
			}
		}
	}
	mean := sum / float64(total)
	stddev := math.Sqrt(sumSq/float64(total) - mean*mean)
	if share := float64(inked) / float64(total); share < 0.005 || stddev < 10 {
		t.Errorf("%s: box %v looks blank: %.1f%% of it inked, luminance stddev %.1f", c.id, box, 100*share, stddev)
	}
	for i, sr := range series {
		// A 2-pixel line across the chart is over a thousand pixels; the
		// legend's mark alone is a few dozen.
		if seen[i] < 300 {
			t.Errorf("%s: series %d (%s) shows in %d pixels of the screenshot, want ≥ 300", c.id, i, hex(sr.color), seen[i])
		}
	}
	t.Logf("%s: box %v, %.0f%% inked, luminance stddev %.0f, pixels of each series' color %v", c.id, box, 100*float64(inked)/float64(total), stddev, seen)
}

// near reports whether px is within tol of want, summed over the channels.
func near(px color.Color, want color.RGBA, tol int) bool {
	r, g, b, _ := px.RGBA()
	d := absDiff(int(r>>8), int(want.R)) + absDiff(int(g>>8), int(want.G)) + absDiff(int(b>>8), int(want.B))
	return d <= tol
}

func absDiff(a, b int) int {
	if a > b {
		return a - b
	}
	return b - a
}

func hex(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }
