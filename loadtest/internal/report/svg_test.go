package report

import (
	"bytes"
	"encoding/xml"
	"errors"
	"io"
	"math"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// svgDoc is what TestWriteSVG reads back from a chart: its title, its
// texts and the paths drawn with the series' line width.
type svgDoc struct {
	title string
	texts []string
	lines map[string][][2]float64 // stroke color → points
}

var (
	seriesStyle = regexp.MustCompile(`stroke-width:2;stroke:(rgb\([0-9,]+\))`)
	pathPoint   = regexp.MustCompile(`[ML]\s*(-?[0-9.]+)\s+(-?[0-9.]+)`)
)

// parseSVG decodes doc as XML, failing on any error, and collects an
// svgDoc.
func parseSVG(t *testing.T, doc []byte) svgDoc {
	t.Helper()
	out := svgDoc{lines: map[string][][2]float64{}}
	dec := xml.NewDecoder(bytes.NewReader(doc))
	var stack []string
	root := ""
	for {
		tok, err := dec.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the SVG is not well-formed XML: %v", err)
		}
		switch tok := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = tok.Name.Local
				if tok.Name.Space != "http://www.w3.org/2000/svg" {
					t.Errorf("root element in namespace %q, want the SVG namespace", tok.Name.Space)
				}
			}
			stack = append(stack, tok.Name.Local)
			if tok.Name.Local != "path" {
				continue
			}
			var d, style string
			for _, a := range tok.Attr {
				switch a.Name.Local {
				case "d":
					d = a.Value
				case "style":
					style = a.Value
				}
			}
			m := seriesStyle.FindStringSubmatch(style)
			if m == nil {
				continue
			}
			for _, p := range pathPoint.FindAllStringSubmatch(d, -1) {
				x, _ := strconv.ParseFloat(p[1], 64)
				y, _ := strconv.ParseFloat(p[2], 64)
				out.lines[m[1]] = append(out.lines[m[1]], [2]float64{x, y})
			}
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if len(stack) == 0 {
				continue
			}
			switch stack[len(stack)-1] {
			case "title":
				out.title = string(tok)
			case "text":
				out.texts = append(out.texts, strings.TrimSpace(string(tok)))
			}
		}
	}
	if root != "svg" {
		t.Fatalf("root element %q, want svg", root)
	}
	return out
}

func TestWriteSVG(t *testing.T) {
	t.Parallel()
	c := Chart{
		Title: "CPU per decision <by keys>", XTitle: "distinct keys", YTitle: "µs",
		X: []float64{1e3, 1e5, 1e6, 1e7}, XNames: []string{"1k", "100k", "1M", "10M"},
		Series: []Series{
			{Name: "uniform", Values: []float64{3, 4, 5, 6}, Color: "#102030"},
			{Name: "zipf", Values: []float64{6, 2, 2.5, 1}, Color: "#405060"},
		},
	}
	var b bytes.Buffer
	if err := WriteSVG(&b, c); err != nil {
		t.Fatal(err)
	}
	doc := parseSVG(t, b.Bytes())
	if doc.title != c.Title {
		t.Errorf("title %q, want %q", doc.title, c.Title)
	}
	for _, want := range append([]string{"uniform", "zipf", "distinct keys", "µs"}, c.XNames...) {
		if !slices.Contains(doc.texts, want) {
			t.Errorf("no text %q in the chart (texts %q)", want, doc.texts)
		}
	}
	colors := map[string]string{"uniform": "rgb(16,32,48)", "zipf": "rgb(64,80,96)"}
	for _, sr := range c.Series {
		pts := doc.lines[colors[sr.Name]]
		if len(pts) != len(c.X) {
			t.Fatalf("series %s: %d points drawn, want %d (lines %v)", sr.Name, len(pts), len(c.X), doc.lines)
		}
		// Points evenly spaced left to right (an axis of categories), and
		// higher values drawn higher (smaller y), in proportion.
		step := pts[1][0] - pts[0][0]
		for i := 1; i < len(pts); i++ {
			if d := pts[i][0] - pts[i-1][0]; step <= 0 || math.Abs(d-step) > 1 {
				t.Errorf("series %s: x of point %d is %v after %v, want steps of %v", sr.Name, i, pts[i][0], pts[i-1][0], step)
			}
		}
		// y = y0 - k·v for one k > 0 across the series' points.
		k := (pts[0][1] - pts[1][1]) / (sr.Values[1] - sr.Values[0])
		for i, v := range sr.Values {
			want := pts[0][1] - k*(v-sr.Values[0])
			if k <= 0 || math.Abs(pts[i][1]-want) > 1.5 {
				t.Errorf("series %s: point %d (value %v) at y %v, want %v", sr.Name, i, v, pts[i][1], want)
			}
		}
	}
}

func TestWriteSVGRefusesBadCharts(t *testing.T) {
	t.Parallel()
	ok := Chart{Title: "t", X: []float64{1, 2}, Series: []Series{{Name: "s", Values: []float64{1, 2}}}}
	cases := []struct {
		name string
		edit func(*Chart)
		want string
	}{
		{"x names short", func(c *Chart) { c.XNames = []string{"a"} }, "1 x names for 2 points"},
		{"no title", func(c *Chart) { c.Title = "" }, "needs a title"},
		{"values short", func(c *Chart) { c.Series[0].Values = []float64{1} }, "1 values for 2 points"},
		{"no points", func(c *Chart) { c.X = nil; c.Series[0].Values = nil }, "has no points"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := ok
			c.Series = []Series{{Name: "s", Values: slices.Clone(ok.Series[0].Values)}}
			tc.edit(&c)
			var b bytes.Buffer
			err := WriteSVG(&b, c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("WriteSVG = %v, want an error with %q", err, tc.want)
			}
			if b.Len() != 0 {
				t.Errorf("%d bytes written for a chart refused", b.Len())
			}
		})
	}
}
