// Package httprec keeps a handler's answer instead of sending it: for
// the caller that reads the answer, rewrites it or sends it later (the
// gateway's forward-auth answer in nginx's form, the aggregator's
// reports gathered from several regions and its global changes, sent
// on once the other regions have them).
package httprec

import (
	"bytes"
	"cmp"
	"net/http"
)

// Recorder is an http.ResponseWriter that keeps the answer. Its Header
// is H: a handler's headers land in whatever map H is (the real
// writer's, for an answer that will go out as it is). It is not safe for
// concurrent use, as an http.ResponseWriter need not be.
type Recorder struct {
	H      http.Header
	Status int // 0 until the handler writes
	Body   bytes.Buffer
}

// Header implements http.ResponseWriter.
func (r *Recorder) Header() http.Header { return r.H }

// WriteHeader implements http.ResponseWriter: the first status stays.
func (r *Recorder) WriteHeader(code int) {
	r.Status = cmp.Or(r.Status, code)
}

// Write implements http.ResponseWriter: a write before any status is
// a 200, as net/http makes it.
func (r *Recorder) Write(b []byte) (int, error) {
	r.Status = cmp.Or(r.Status, http.StatusOK)
	return r.Body.Write(b)
}

// Code is the answer's status: Status, or 200 for a handler that wrote
// nothing (net/http's answer then).
func (r *Recorder) Code() int {
	if r.Status == 0 {
		return http.StatusOK
	}
	return r.Status
}

// Flush sends the kept answer to w, with Code as its status (headers set
// in H are w's when H is w.Header()).
func (r *Recorder) Flush(w http.ResponseWriter) {
	w.WriteHeader(r.Code())
	_, _ = w.Write(r.Body.Bytes())
}
