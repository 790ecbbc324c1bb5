package reports

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/internal/httprec"
)

// A global report (?regions=all) sums the reports of every region the
// rules' `regions` list names: this region's from its own state, every
// other region's asked of that region's aggregators over the link between
// regions (RegionsConfig.Ask). A region that does not answer within the
// timeout, or answers with an error, is named in the answer's
// missing_regions and in the MissingRegionsHeader header: a partial total
// is never silent.

// MissingRegionsHeader names, comma-separated, the regions a global report
// lacks; it is absent when every region answered.
const MissingRegionsHeader = "Tollgate-Missing-Regions"

// DefaultRegionTimeout bounds the wait for other regions' answers.
const DefaultRegionTimeout = 3 * time.Second

// RegionRequest is a report asked of another region: the report's path
// (/v1/usage/...) and its query, already checked by the asking region.
type RegionRequest struct {
	Path  string `json:"path"`
	Query string `json:"query"`
}

// RegionReply is a region's answer to a RegionRequest: the HTTP status its
// report handler gave, and its JSON body.
type RegionReply struct {
	Status int             `json:"status"`
	Body   json.RawMessage `json:"body"`
}

// Errors of the regions link.
var (
	// ErrRegionUnavailable is a region that cannot answer now (its state
	// is being restored, or its report failed).
	ErrRegionUnavailable = errors.New("reports: region unavailable")
)

// RegionsConfig configures WithRegions.
type RegionsConfig struct {
	// Region is this aggregator's region.
	Region string
	// Regions returns the names of the rules' `regions` list, or none when
	// the rules have no list (the deployment is one region).
	Regions func(ctx context.Context) ([]string, error)
	// Ask asks region's aggregators for a report; nil when there is no
	// link between regions (every other region is then missing).
	Ask func(ctx context.Context, region string, req RegionRequest) (RegionReply, error)
	// Timeout bounds the wait for the other regions (default
	// DefaultRegionTimeout).
	Timeout time.Duration
	// MaxRows is the handler's MaxRows (default 10000).
	MaxRows int
}

// RegionsAnswer is a global report's JSON answer: Answer, plus the regions
// summed and the regions missing.
type RegionsAnswer struct {
	Answer
	// Regions are the regions whose reports are summed, in the list's
	// order.
	Regions []string `json:"regions"`
	// MissingRegions are the regions that did not answer: the totals lack
	// their decisions.
	MissingRegions []string `json:"missing_regions"`
	// Truncated is set when rows were left out (more than limit rows in
	// all); the totals always cover the whole range.
	Truncated bool `json:"truncated,omitempty"`
}

// WithRegions wraps the report handler local (the routes Register adds):
// a request without `regions` goes to local unchanged; `regions=all` is a
// global report; any other value is refused 400 INVALID_REQUEST.
func WithRegions(local http.Handler, cfg RegionsConfig) http.Handler {
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultRegionTimeout
	}
	if cfg.MaxRows <= 0 {
		cfg.MaxRows = 10_000
	}
	g := &global{local: local, cfg: cfg}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v := r.URL.Query()
		if !v.Has("regions") {
			local.ServeHTTP(w, r)
			return
		}
		if vals := v["regions"]; len(vals) != 1 || vals[0] != "all" {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "regions: all (every region of the rules' regions list), or leave it out for this region's report")
			return
		}
		if v.Has("cursor") {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "cursor: a report with regions=all has no pages; narrow from and to instead")
			return
		}
		g.serve(w, r)
	})
}

type global struct {
	local http.Handler
	cfg   RegionsConfig
}

// regionResult is one region's part of a global report.
type regionResult struct {
	ans Answer
	err error
}

func (g *global) serve(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query()
	format := v.Get("format")
	v.Del("regions")
	v.Set("format", "json")
	req := RegionRequest{Path: r.URL.Path, Query: v.Encode()}
	// This region first: it checks the query, and its error (a bad
	// parameter, a state being restored) is the answer.
	rec := ServeLocal(r.Context(), g.local, req, 0)
	if rec.Status != http.StatusOK {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rec.Status)
		_, _ = w.Write(rec.Body)
		return
	}
	var own Answer
	if err := json.Unmarshal(rec.Body, &own); err != nil {
		apierror.Write(w, http.StatusInternalServerError, apierror.Internal, "reading this region's report failed")
		return
	}
	names, err := g.cfg.Regions(r.Context())
	if err != nil {
		apierror.Write(w, http.StatusServiceUnavailable, apierror.Unavailable, "reading the rules' regions list failed: "+err.Error())
		return
	}
	if len(names) == 0 {
		names = []string{g.cfg.Region}
	}
	results := make([]regionResult, len(names))
	ctx, cancel := context.WithTimeout(r.Context(), g.cfg.Timeout)
	defer cancel()
	var wg sync.WaitGroup
	for i, name := range names {
		if name == g.cfg.Region {
			results[i] = regionResult{ans: own}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[i] = g.ask(ctx, name, req)
		}()
	}
	wg.Wait()
	limit := g.cfg.MaxRows
	if s := v.Get("limit"); s != "" {
		limit, _ = strconv.Atoi(s) // checked by this region's report
	}
	ans := RegionsAnswer{Answer: own, Regions: []string{}, MissingRegions: []string{}}
	ans.Rows, ans.Totals, ans.NextCursor = nil, Totals{}, ""
	var parts []Answer
	for i, res := range results {
		if res.err != nil {
			ans.MissingRegions = append(ans.MissingRegions, names[i])
			continue
		}
		ans.Regions = append(ans.Regions, names[i])
		parts = append(parts, res.ans)
	}
	ans.Rows, ans.Totals, ans.Truncated = Merge(parts, limit)
	if len(ans.MissingRegions) > 0 {
		w.Header().Set(MissingRegionsHeader, strings.Join(ans.MissingRegions, ","))
	}
	writeAnswer(w, format, ans, ans.Rows)
}

// ask asks one other region for its report.
func (g *global) ask(ctx context.Context, region string, req RegionRequest) regionResult {
	if g.cfg.Ask == nil {
		return regionResult{err: fmt.Errorf("%w: no link between regions", ErrRegionUnavailable)}
	}
	rep, err := g.cfg.Ask(ctx, region, req)
	if err != nil {
		return regionResult{err: fmt.Errorf("asking region %s: %w", region, err)}
	}
	if rep.Status != http.StatusOK {
		return regionResult{err: fmt.Errorf("%w: region %s answered %d", ErrRegionUnavailable, region, rep.Status)}
	}
	var a Answer
	if err := json.Unmarshal(rep.Body, &a); err != nil {
		return regionResult{err: fmt.Errorf("region %s's report: %w", region, err)}
	}
	return regionResult{ans: a}
}

// Merge sums regions' reports: rows of the same window, key_id and
// endpoint are added, the rows are ordered by window, key_id and endpoint
// and cut at limit (truncated then, or when a part had more pages), and
// the totals are summed.
func Merge(parts []Answer, limit int) (rows []Row, tot Totals, truncated bool) {
	type rowKey struct{ start, keyID, endpoint string }
	at := map[rowKey]int{}
	rows = []Row{}
	for _, p := range parts {
		tot.Allowed += p.Totals.Allowed
		tot.Rejected += p.Totals.Rejected
		tot.Cost += p.Totals.Cost
		truncated = truncated || p.NextCursor != ""
		for _, r := range p.Rows {
			k := rowKey{r.WindowStart, r.KeyID, r.Endpoint}
			if i, ok := at[k]; ok {
				rows[i].Allowed += r.Allowed
				rows[i].Rejected += r.Rejected
				rows[i].Cost += r.Cost
				rows[i].KeyPrefix = cmp.Or(rows[i].KeyPrefix, r.KeyPrefix)
				continue
			}
			at[k] = len(rows)
			rows = append(rows, r)
		}
	}
	slices.SortFunc(rows, func(a, b Row) int {
		return cmp.Or(cmp.Compare(a.WindowStart, b.WindowStart), cmp.Compare(a.KeyID, b.KeyID), cmp.Compare(a.Endpoint, b.Endpoint))
	})
	if limit > 0 && len(rows) > limit {
		rows, truncated = rows[:limit], true
	}
	return rows, tot, truncated
}

// ServeLocal answers req with the report handler local, in process: what
// a region serves to another region's global report. The query's
// `regions` is dropped (a region asked answers its own report only), and
// only report paths are served. With maxBytes > 0 an answer larger than
// that is asked again with half the rows, until it fits (the totals stay
// whole; the answer's next_cursor says rows were left out).
func ServeLocal(ctx context.Context, local http.Handler, req RegionRequest, maxBytes int) RegionReply {
	rep := serveLocal(ctx, local, req)
	for maxBytes > 0 && len(rep.Body) > maxBytes && rep.Status == http.StatusOK {
		var a Answer
		if json.Unmarshal(rep.Body, &a) != nil || len(a.Rows) <= 1 {
			return RegionReply{Status: http.StatusInternalServerError, Body: errorBody(apierror.Internal, "the report does not fit one message")}
		}
		v, _ := url.ParseQuery(req.Query)
		v.Set("limit", strconv.Itoa(len(a.Rows)/2))
		req.Query = v.Encode()
		rep = serveLocal(ctx, local, req)
	}
	return rep
}

func serveLocal(ctx context.Context, local http.Handler, req RegionRequest) RegionReply {
	if !strings.HasPrefix(req.Path, "/v1/usage/") {
		return RegionReply{Status: http.StatusBadRequest, Body: errorBody(apierror.InvalidRequest, "not a usage report path")}
	}
	v, err := url.ParseQuery(req.Query)
	if err != nil {
		return RegionReply{Status: http.StatusBadRequest, Body: errorBody(apierror.InvalidRequest, "query: "+err.Error())}
	}
	v.Del("regions")
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, (&url.URL{Path: req.Path, RawQuery: v.Encode()}).String(), nil)
	if err != nil {
		return RegionReply{Status: http.StatusBadRequest, Body: errorBody(apierror.InvalidRequest, "path: "+err.Error())}
	}
	rec := &httprec.Recorder{H: http.Header{}}
	local.ServeHTTP(rec, hr)
	body := bytes.TrimSpace(rec.Body.Bytes())
	if !json.Valid(body) {
		return RegionReply{Status: http.StatusInternalServerError, Body: errorBody(apierror.Internal, "the report was not JSON")}
	}
	return RegionReply{Status: rec.Code(), Body: body}
}

// ErrorReply is a RegionReply carrying an error in apierror's shape.
func ErrorReply(status int, code, msg string) RegionReply {
	return RegionReply{Status: status, Body: errorBody(code, msg)}
}

func errorBody(code, msg string) json.RawMessage {
	b, _ := json.Marshal(map[string]any{"error": map[string]string{"code": code, "message": msg}})
	return b
}
