// Package reports serves the usage reports:
//
//	GET /v1/usage/tenants/{tenant}
//	GET /v1/usage/keys/{key}        ({key}: an API key, or kid:<key_id>)
//
// with from and to (RFC 3339; windows starting in [from, to); defaults: the
// last 24 hours up to now, open windows included), granularity (minute,
// hour or day; default hour), format (json or csv; default json), limit
// (rows per answer, default and maximum Config.MaxRows) and cursor (the
// next_cursor of an earlier answer). The totals always cover the whole
// range, whatever page is asked for. Errors are apierror's
// {"error":{"code","message"}}.
//
// Every instance holds a replica of every partition's rows (package
// state), so any instance answers completely once it is ready.
package reports

import (
	"bufio"
	"cmp"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tollgate/tollgate/aggregator/internal/state"
	"github.com/tollgate/tollgate/aggregator/internal/windows"
	"github.com/tollgate/tollgate/configs"
	"github.com/tollgate/tollgate/guard/apierror"
	"github.com/tollgate/tollgate/guard/keyid"
)

// Config configures the handler.
type Config struct {
	DB *state.DB
	// Hasher turns raw API keys into key_ids.
	Hasher *keyid.Hasher
	// MaxRows bounds the rows of one answer (default 10000).
	MaxRows int
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Register adds the report routes to mux. Authentication is the caller's
// (the operator token wraps the whole listener).
func Register(mux *http.ServeMux, cfg Config) {
	configs.DefaultPositive(&cfg.MaxRows, 10_000)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	h := &handler{cfg: cfg}
	mux.HandleFunc("GET /v1/usage/tenants/{tenant}", h.tenant)
	mux.HandleFunc("GET /v1/usage/keys/{key}", h.key)
}

type handler struct{ cfg Config }

func (h *handler) tenant(w http.ResponseWriter, r *http.Request) {
	t := r.PathValue("tenant")
	if t == "" || len(t) > 256 {
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "tenant: 1 to 256 bytes")
		return
	}
	h.serve(w, r, state.Query{Tenant: t})
}

func (h *handler) key(w http.ResponseWriter, r *http.Request) {
	k := r.PathValue("key")
	id, ok := strings.CutPrefix(k, "kid:")
	switch {
	case ok:
		if !keyid.Valid(id) {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidKey, "kid: must be followed by a 22-character key_id")
			return
		}
	case k == "" || len(k) > 256:
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidKey, "key: 1 to 256 bytes, or kid:<key_id>")
		return
	default:
		id = h.cfg.Hasher.ID(k)
	}
	h.serve(w, r, state.Query{KeyID: id})
}

// Row is one JSON row.
type Row struct {
	WindowStart string `json:"window_start"`
	KeyID       string `json:"key_id"`
	KeyPrefix   string `json:"key_prefix"`
	Endpoint    string `json:"endpoint"`
	Allowed     int64  `json:"allowed"`
	Rejected    int64  `json:"rejected"`
	Cost        int64  `json:"cost"`
}

// Totals sums a report.
type Totals struct {
	Allowed  int64 `json:"allowed"`
	Rejected int64 `json:"rejected"`
	Cost     int64 `json:"cost"`
}

// Answer is the JSON answer.
type Answer struct {
	Tenant      string `json:"tenant,omitempty"`
	KeyID       string `json:"key_id,omitempty"`
	From        string `json:"from"`
	To          string `json:"to"`
	Granularity string `json:"granularity"`
	Rows        []Row  `json:"rows"`
	Totals      Totals `json:"totals"`
	NextCursor  string `json:"next_cursor,omitempty"`
}

func (h *handler) serve(w http.ResponseWriter, r *http.Request, q state.Query) {
	v := r.URL.Query()
	now := h.cfg.Now()
	to, err := parseTime(v.Get("to"), now)
	if err != nil {
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "to: "+err.Error())
		return
	}
	from, err := parseTime(v.Get("from"), to.Add(-24*time.Hour))
	if err != nil {
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "from: "+err.Error())
		return
	}
	if !from.Before(to) {
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "from must be before to")
		return
	}
	gname := cmp.Or(v.Get("granularity"), "hour")
	g, ok := windows.ParseGranularity(gname)
	if !ok {
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "granularity: minute, hour or day")
		return
	}
	format := cmp.Or(v.Get("format"), "json")
	if format != "json" && format != "csv" {
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "format: json or csv")
		return
	}
	limit := h.cfg.MaxRows
	if s := v.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > h.cfg.MaxRows {
			apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "limit: 1 to "+strconv.Itoa(h.cfg.MaxRows))
			return
		}
		limit = n
	}
	// Windows that start in [from, to): a window containing `from` starts
	// before it, so round from down to the window's start.
	q.Gran, q.Limit, q.Cursor = g, limit, v.Get("cursor")
	q.From = from.Unix() - windows.Mod(from.Unix(), g.Seconds())
	q.To = to.Unix()
	if to.Nanosecond() > 0 {
		q.To++
	}
	rows, next, err := h.cfg.DB.Report(q)
	if errors.Is(err, state.ErrBadCursor) {
		apierror.Write(w, http.StatusBadRequest, apierror.InvalidRequest, "cursor: not one this service returned for this query")
		return
	}
	if err != nil {
		apierror.Write(w, http.StatusInternalServerError, apierror.Internal, "reading usage failed")
		return
	}
	var tot Totals
	tot.Allowed, tot.Rejected, tot.Cost, err = h.cfg.DB.Totals(q)
	if err != nil {
		apierror.Write(w, http.StatusInternalServerError, apierror.Internal, "reading usage failed")
		return
	}
	ans := Answer{Tenant: q.Tenant, KeyID: q.KeyID, From: time.Unix(q.From, 0).UTC().Format(time.RFC3339),
		To: to.UTC().Format(time.RFC3339), Granularity: g.String(), Rows: make([]Row, 0, len(rows)), Totals: tot, NextCursor: next}
	if q.Tenant != "" {
		ans.KeyID = ""
	}
	for _, rr := range rows {
		ans.Rows = append(ans.Rows, Row{WindowStart: time.Unix(rr.Start, 0).UTC().Format(time.RFC3339), KeyID: rr.KeyID,
			KeyPrefix: rr.KeyPrefix, Endpoint: rr.Endpoint, Allowed: rr.Allowed, Rejected: rr.Rejected, Cost: rr.Cost})
	}
	if next != "" {
		w.Header().Set("X-Next-Cursor", next)
	}
	writeAnswer(w, format, ans, ans.Rows)
}

func parseTime(s string, def time.Time) (time.Time, error) {
	if s == "" {
		return def, nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return t, errors.New("not an RFC 3339 time (e.g. 2026-11-23T12:00:00Z)")
	}
	return t, nil
}

// csvHeader is the first line of a CSV report.
var csvHeader = []string{"window_start", "key_id", "key_prefix", "endpoint", "allowed", "rejected", "cost"}

// writeAnswer writes a report's answer: its rows as CSV when format is
// csv, else the whole answer as indented JSON.
func writeAnswer(w http.ResponseWriter, format string, ans any, rows []Row) {
	if format == "csv" {
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		_ = writeCSV(w, rows)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(ans)
}

// writeCSV writes rows as CSV (RFC 4180 quoting, one line per row ending
// in LF, as encoding/csv writes), the header first. Every cell is safe to open in a spreadsheet: one that starts with
// '=', '+', '-', '@', a tab or a carriage return — which Excel, LibreOffice
// and Google Sheets would read as a formula — is neutralised as OWASP
// recommends: a single quote is put before it and the cell is quoted. Any
// client chooses its API key and its path, so key prefixes and endpoints
// are hostile input; key_ids (base64url) may start with '-' too. A program
// reading the CSV drops the leading quote of a quoted cell that starts
// with "'" followed by one of those characters.
func writeCSV(w io.Writer, rows []Row) error {
	bw := bufio.NewWriter(w)
	writeCSVLine(bw, csvHeader)
	for _, rr := range rows {
		writeCSVLine(bw, []string{rr.WindowStart, rr.KeyID, rr.KeyPrefix, rr.Endpoint,
			strconv.FormatInt(rr.Allowed, 10), strconv.FormatInt(rr.Rejected, 10), strconv.FormatInt(rr.Cost, 10)})
	}
	return bw.Flush()
}

func writeCSVLine(w *bufio.Writer, cells []string) {
	for i, c := range cells {
		if i > 0 {
			_ = w.WriteByte(',')
		}
		_, _ = w.WriteString(csvCell(c))
	}
	_ = w.WriteByte('\n')
}

// csvCell returns one cell as written in a CSV report: neutralised when a
// spreadsheet would take it for a formula (a leading single quote, and
// quoted), quoted when it holds a comma, a double quote, a line break or
// leading or trailing space, else as is.
func csvCell(c string) string {
	formula := c != "" && strings.ContainsRune("=+-@\t\r", rune(c[0]))
	if formula {
		c = "'" + c
	}
	if !formula && !strings.ContainsAny(c, ",\"\r\n") && strings.TrimSpace(c) == c {
		return c
	}
	return `"` + strings.ReplaceAll(c, `"`, `""`) + `"`
}
