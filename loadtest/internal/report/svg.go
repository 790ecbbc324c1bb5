package report

import (
	"fmt"
	"html"
	"io"
	"strings"
)

// WriteSVG writes c alone as an SVG document, drawn as the HTML page
// draws its charts: for figures kept as files (docs/img) rather than in a
// run's page. Nothing is written when c is not valid.
func WriteSVG(w io.Writer, c Chart) error {
	if err := c.validate(); err != nil {
		return err
	}
	svg, err := renderSVG(c)
	if err != nil {
		return fmt.Errorf("report: chart %q: %w", c.Title, err)
	}
	// The page shows a chart's title above it; a file carries it inside,
	// for viewers and screen readers.
	if i := strings.Index(svg, ">"); strings.HasPrefix(svg, "<svg") && i > 0 {
		svg = svg[:i+1] + "<title>" + html.EscapeString(c.Title) + "</title>" + svg[i+1:]
	}
	if _, err := io.WriteString(w, svg+"\n"); err != nil {
		return fmt.Errorf("report: write chart %q: %w", c.Title, err)
	}
	return nil
}
