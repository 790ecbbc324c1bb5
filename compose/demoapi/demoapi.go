// Package demoapi is the tiny HTTP API the local stack (make run) puts
// behind the gateway, so that a newcomer has something to rate-limit
// before pointing Tollgate at their own service.
//
// Every path answers 200 with a small JSON document describing the
// request:
//
//	{"ok":true,"service":"tollgate-demo-api","method":"GET","path":"/v1/users/42"}
//
// (with "query" when the request has one). GET /v1/slow?ms=N waits N
// milliseconds (0 to [MaxSlow] in ms; default 100) before answering, for
// latency demos; the wait ends early when the client goes away. A bad ms
// is answered 400 with {"ok":false,"error":"…"}.
//
// The handler keeps no state and starts no goroutines; it is safe for
// concurrent use.
package demoapi

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"
)

// Service is the "service" field of every answer, so a client can tell the
// demo API's answers from the gateway's own (429, 403, 400).
const Service = "tollgate-demo-api"

// Bounds of GET /v1/slow.
const (
	// MaxSlow is the longest wait /v1/slow accepts.
	MaxSlow = 10 * time.Second
	// DefaultSlow is the wait of /v1/slow without ms.
	DefaultSlow = 100 * time.Millisecond
)

// SlowPath is the path of the latency endpoint.
const SlowPath = "/v1/slow"

// answer is the JSON body of every response.
type answer struct {
	OK      bool   `json:"ok"`
	Service string `json:"service"`
	Method  string `json:"method,omitempty"`
	Path    string `json:"path,omitempty"`
	Query   string `json:"query,omitempty"`
	SleptMS *int64 `json:"slept_ms,omitempty"`
	Error   string `json:"error,omitempty"`
}

// Handler returns the demo API.
func Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(SlowPath, slow)
	mux.HandleFunc("/", echo)
	return mux
}

func echo(w http.ResponseWriter, r *http.Request) {
	write(w, http.StatusOK, describe(r))
}

func describe(r *http.Request) answer {
	return answer{OK: true, Service: Service, Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery}
}

func slow(w http.ResponseWriter, r *http.Request) {
	d := DefaultSlow
	if raw := r.URL.Query().Get("ms"); raw != "" {
		ms, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || ms < 0 || ms > MaxSlow.Milliseconds() {
			write(w, http.StatusBadRequest, answer{
				Service: Service,
				Error:   "ms must be a whole number of milliseconds from 0 to " + strconv.FormatInt(MaxSlow.Milliseconds(), 10),
			})
			return
		}
		d = time.Duration(ms) * time.Millisecond
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-r.Context().Done():
		return // the client went away; nobody reads an answer
	}
	a := describe(r)
	ms := d.Milliseconds()
	a.SleptMS = &ms
	write(w, http.StatusOK, a)
}

func write(w http.ResponseWriter, status int, a answer) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(a)
}
