package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// monitorEvery is how often the monitor reads the loss counters and
// looks for Redis processes that died on their own.
const monitorEvery = 2 * time.Second

// monitor reads the aggregators' missing and the gateways' dropped
// counts, and notices a Redis node or sentinel that died without the
// harness killing it (recorded as an unplanned exit, then restarted, so
// the run goes on), until ctx is done.
func (e *executor) monitor(ctx context.Context) {
	service.Every(ctx, monitorEvery, func(time.Time) { e.look(ctx) })
}

// look is one round of the monitor: it scrapes the loss counters and
// restarts what died with no fault in force.
func (e *executor) look(ctx context.Context) {
	e.scrapeAll(ctx)
	for _, n := range append(append([]*redisNode(nil), e.f.redisNodes...), e.f.sentinels...) {
		key := n.name
		if !strings.HasPrefix(key, "sentinel-") {
			key = "redis"
		}
		n.mu.Lock()
		killed := n.killed
		n.mu.Unlock()
		if n.srv.Pid() != 0 || (killed && e.isBusy(key)) {
			continue
		}
		if killed {
			e.rec.logf("%s is down with no fault in force: restarting it", n.name)
		} else {
			e.rec.proc(history.Proc{Name: n.name, Kind: history.ProcExit, Detail: "died (log " + n.srv.LogPath() + ")"})
		}
		if err := n.srv.Restart(ctx); err == nil {
			n.mu.Lock()
			n.killed = false
			n.mu.Unlock()
			e.rec.proc(history.Proc{Name: n.name, Kind: history.ProcStart, Detail: "restarted by the monitor"})
		}
	}
	for _, p := range e.f.procs() {
		p.mu.Lock()
		l, planned, starting := p.life, p.planned, p.starting
		p.mu.Unlock()
		if l == nil || !l.exited() || starting || (planned && e.isBusy(p.name)) {
			continue
		}
		// Died on its own (recorded when it exited), or left down
		// with no fault in force: start it again so that the run
		// goes on.
		if planned {
			e.rec.logf("%s is down with no fault in force: starting it", p.name)
		}
		if err := p.start(ctx); err != nil {
			e.rec.logf("%s: start by the monitor failed: %v", p.name, err)
		}
	}
}

// isBusy reports whether a fault of the schedule holds key (busyKey).
func (e *executor) isBusy(key string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.busy[key]
}

// scrapeAll reads the counters of every process that runs and is not
// paused.
func (e *executor) scrapeAll(ctx context.Context) {
	for _, a := range e.f.aggs {
		if a.proc.running() && !a.proc.isPaused() {
			_ = e.missing.read(ctx, a.name, a.proc.pid(), "http://"+a.metrics+"/metrics")
		}
	}
	for _, g := range e.f.gws {
		if g.proc.running() && !g.proc.isPaused() {
			_ = e.dropped.read(ctx, g.name, g.proc.pid(), "http://"+g.metrics+"/metrics")
		}
	}
}

// usageOf reads aggregator a's report of every tenant over the run.
func (f *fleet) usageOf(ctx context.Context, a *aggregator, from time.Time) history.Usage {
	u := history.Usage{Aggregator: a.name, At: now(), Tenants: map[string]history.Totals{}}
	seen := map[string]bool{}
	for _, k := range f.keys {
		if seen[k.Tenant] {
			continue
		}
		seen[k.Tenant] = true
		q := url.Values{"from": {from.Add(-time.Hour).UTC().Format(time.RFC3339)}, "to": {time.Now().Add(time.Hour).UTC().Format(time.RFC3339)},
			"granularity": {"hour"}, "limit": {"1"}}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.api+"/v1/usage/tenants/"+url.PathEscape(k.Tenant)+"?"+q.Encode(), nil)
		if err != nil {
			u.Err = err.Error()
			return u
		}
		req.Header.Set("Authorization", "Bearer "+f.token)
		resp, err := probeClient.Do(req)
		if err != nil {
			u.Err = shortErr(err)
			return u
		}
		var ans struct {
			Totals history.Totals `json:"totals"`
		}
		err = json.NewDecoder(resp.Body).Decode(&ans)
		resp.Body.Close()
		if resp.StatusCode != 200 || err != nil {
			u.Err = fmt.Sprintf("tenant %s: %d %v", k.Tenant, resp.StatusCode, err)
			return u
		}
		u.Tenants[k.Tenant] = ans.Totals
	}
	return u
}

// converge reads every aggregator's report until they agree and have not
// changed for three reads a second apart, or d passes; it returns the
// last reads.
func (f *fleet) converge(ctx context.Context, from time.Time, d time.Duration) ([]history.Usage, bool) {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var last []history.Usage
	stable := 0
	for {
		var cur []history.Usage
		for _, a := range f.aggs {
			cur = append(cur, f.usageOf(ctx, a, from))
		}
		if sameUsage(cur, last) && agree(cur) {
			stable++
		} else {
			stable = 0
		}
		last = cur
		if stable >= 3 {
			return cur, true
		}
		select {
		case <-ctx.Done():
			return cur, false
		case <-time.After(time.Second):
		}
	}
}

// agree reports whether every read answered, with the same totals.
func agree(us []history.Usage) bool {
	for _, u := range us {
		if u.Err != "" || !sameTotals(u.Tenants, us[0].Tenants) {
			return false
		}
	}
	return true
}

func sameUsage(a, b []history.Usage) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i].Err != b[i].Err || !sameTotals(a[i].Tenants, b[i].Tenants) {
			return false
		}
	}
	return true
}

func sameTotals(a, b map[string]history.Totals) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
