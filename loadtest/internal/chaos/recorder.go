package chaos

import (
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
	"github.com/tollgate/tollgate/loadtest/internal/report"
)

// Outcomes of the soak's answers for the per-second charts, in order.
const (
	out2xx = iota
	out429
	out403
	out400
	out5xx
	outOther
)

var outcomes = []report.Outcome{
	out2xx:   {Name: "2xx", Decision: true},
	out429:   {Name: "429", Decision: true},
	out403:   {Name: "403", Decision: true},
	out400:   {Name: "400", Decision: false},
	out5xx:   {Name: "5xx", Decision: false},
	outOther: {Name: "other", Decision: false},
}

func outcomeOf(status int) int {
	switch {
	case status == 429:
		return out429
	case status == 403:
		return out403
	case status == 400:
		return out400
	case status >= 200 && status < 300:
		return out2xx
	case status >= 500:
		return out5xx
	}
	return outOther
}

// recorder collects the history as the run goes; it is safe for
// concurrent use.
type recorder struct {
	stats *report.Recorder
	log   io.Writer // progress lines; nil: none
	t0    time.Time

	mu sync.Mutex
	h  history.History // guarded by mu
}

func newRecorder(log io.Writer) *recorder {
	return &recorder{stats: report.NewRecorder(outcomes), log: log, t0: time.Now()}
}

func now() history.Micros { return time.Now().UnixMicro() }

// logf writes a progress line, stamped with the seconds since the start.
func (r *recorder) logf(format string, args ...any) {
	if r.log == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.log, "%7.1fs  %s\n", time.Since(r.t0).Seconds(), fmt.Sprintf(format, args...))
}

func (r *recorder) answer(a history.Answer) {
	r.mu.Lock()
	r.h.Answers = append(r.h.Answers, a)
	r.mu.Unlock()
	sent := time.UnixMicro(a.Sent)
	if a.Status == 0 {
		r.stats.Error(fmt.Errorf("%s", a.Err))
		return
	}
	r.stats.Record(outcomeOf(a.Status), sent, time.Duration(a.Recv-a.Sent)*time.Microsecond)
}

func (r *recorder) proc(p history.Proc) {
	p.At = now()
	r.mu.Lock()
	r.h.Procs = append(r.h.Procs, p)
	r.mu.Unlock()
	if p.Kind == history.ProcExit && !p.Planned {
		r.logf("UNPLANNED EXIT of %s: %s", p.Name, p.Detail)
	}
}

// fault records f and returns its index, for ended.
func (r *recorder) fault(f history.Fault) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Faults = append(r.h.Faults, f)
	return len(r.h.Faults) - 1
}

// ended records the heal of fault i.
func (r *recorder) ended(i int, at history.Micros, errText string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.h.Faults[i].End = at
	if errText != "" {
		r.h.Faults[i].Error = errText
	}
}

func (r *recorder) op(o history.Op) {
	r.mu.Lock()
	r.h.Ops = append(r.h.Ops, o)
	r.mu.Unlock()
}

func (r *recorder) probe(p history.Probe) {
	r.mu.Lock()
	r.h.Probes = append(r.h.Probes, p)
	r.mu.Unlock()
}

// history returns the history so far; the caller owns the copy of its
// slices' headers, not of their elements.
func (r *recorder) history() history.History {
	r.mu.Lock()
	defer r.mu.Unlock()
	h := r.h
	h.Answers = append([]history.Answer(nil), r.h.Answers...)
	h.Faults = append([]history.Fault(nil), r.h.Faults...)
	h.Ops = append([]history.Op(nil), r.h.Ops...)
	h.Procs = append([]history.Proc(nil), r.h.Procs...)
	h.Probes = append([]history.Probe(nil), r.h.Probes...)
	h.Stalls = append([]history.Stall(nil), r.h.Stalls...)
	return h
}
