package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// Operator changes: one every 6 to 12 s of the fault phase, on hot keys
// only; a final one after the heal, timed on every gateway.
const (
	opTimeout    = 5 * time.Second
	finalOpsRule = 17 // the ops rule's last limit: never drawn before
	propWait     = 10 * time.Second
)

// operator makes the operator's changes through the operator API of a
// live aggregator.
type operator struct {
	f    *fleet
	rec  *recorder
	seed uint64
	http *http.Client
}

func newOperator(f *fleet, rec *recorder, seed uint64) *operator {
	return &operator{f: f, rec: rec, seed: seed, http: &http.Client{Timeout: opTimeout, Transport: &http.Transport{Proxy: nil}}}
}

// liveAggregator returns the API of an aggregator that runs and is not
// paused, preferring the first.
func (o *operator) liveAggregator() (*aggregator, error) {
	for _, a := range o.f.aggs {
		if a.proc.running() && !a.proc.isPaused() {
			return a, nil
		}
	}
	return nil, errors.New("no aggregator running")
}

// send makes one change and records it.
func (o *operator) send(ctx context.Context, op history.Op, method, path, ctype string, body []byte) history.Op {
	op.At = now()
	defer func() { o.rec.op(op) }()
	a, err := o.liveAggregator()
	if err != nil {
		op.Err = err.Error()
		op.Done = now()
		return op
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+a.api+"/admin/v1/"+path, bytes.NewReader(body))
	if err != nil {
		op.Err = err.Error()
		return op
	}
	req.Header.Set("Authorization", "Bearer "+o.f.token)
	req.Header.Set("X-Tollgate-Actor", "chaos")
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := o.http.Do(req)
	if err != nil {
		op.Err = shortErr(err)
		return op // Done stays 0: it may still happen
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	op.Done, op.Status = now(), resp.StatusCode
	if resp.StatusCode >= 300 {
		op.Err = strings.TrimSpace(string(b))
		if len(op.Err) > 200 {
			op.Err = op.Err[:200]
		}
	}
	return op
}

func keyPath(k *history.Key) string { return url.PathEscape(k.Raw) }

// setOpsLimit puts the ruleset with the ops rule at limit.
func (o *operator) setOpsLimit(ctx context.Context, limit int64, final bool) history.Op {
	body := rulesYAML(o.f.rules, o.f.keys, limit)
	return o.send(ctx, history.Op{Kind: history.OpRules, Rule: opsRule, Limit: limit, Final: final},
		http.MethodPut, "rules", "application/yaml", []byte(body))
}

// run makes a change every 6 to 12 s until ctx is done.
func (o *operator) run(ctx context.Context) {
	rng := rand.New(rand.NewPCG(o.seed, 0x0e7a))
	var hot []*history.Key
	for i := range o.f.keys {
		if k := &o.f.keys[i]; strings.HasSuffix(k.Name, "hot1") || strings.HasSuffix(k.Name, "hot2") {
			hot = append(hot, k)
		}
	}
	t := time.NewTimer(3 * time.Second)
	defer t.Stop()
	for service.Wait(ctx, t.C) {
		t.Reset(6*time.Second + time.Duration(rng.Int64N(int64(6*time.Second))))
		k := hot[rng.IntN(len(hot))]
		eps := hot1Endpoints
		if strings.HasSuffix(k.Name, "hot2") {
			eps = hot2Endpoints
		}
		ep := eps[rng.IntN(len(eps))].endpoint
		var op history.Op
		switch rng.IntN(7) {
		case 0:
			op = o.setOpsLimit(ctx, int64(6+rng.IntN(11)), false)
		case 1:
			body, _ := json.Marshal(map[string]string{"ttl": "5s", "reason": "chaos"})
			op = o.send(ctx, history.Op{Kind: history.OpBlock, Key: k.Name, TTL: (5 * time.Second).Microseconds()},
				http.MethodPut, "blocklist/"+keyPath(k), "application/json", body)
		case 2:
			op = o.send(ctx, history.Op{Kind: history.OpUnblock, Key: k.Name}, http.MethodDelete, "blocklist/"+keyPath(k), "", nil)
		case 3:
			body, _ := json.Marshal(map[string]any{"factor": 2, "ttl": "10s", "reason": "chaos"})
			op = o.send(ctx, history.Op{Kind: history.OpOverride, Key: k.Name, Factor: 2, TTL: (10 * time.Second).Microseconds()},
				http.MethodPut, "overrides/"+keyPath(k), "application/json", body)
		case 4:
			op = o.send(ctx, history.Op{Kind: history.OpUnrideKey, Key: k.Name}, http.MethodDelete, "overrides/"+keyPath(k), "", nil)
		case 5:
			body, _ := json.Marshal(map[string]string{"endpoint": ep, "reason": "chaos"})
			op = o.send(ctx, history.Op{Kind: history.OpReset, Key: k.Name, Endpoint: ep}, http.MethodPost, "keys/"+keyPath(k)+"/reset", "application/json", body)
		default:
			body, _ := json.Marshal(map[string]any{"endpoint": ep, "tokens": 5, "reason": "chaos"})
			op = o.send(ctx, history.Op{Kind: history.OpQuota, Key: k.Name, Endpoint: ep, Tokens: 5}, http.MethodPost, "keys/"+keyPath(k)+"/quota", "application/json", body)
		}
		status := fmt.Sprint(op.Status)
		if op.Err != "" {
			status += " " + op.Err
		}
		o.rec.logf("operator: %s %s%s%s → %s", op.Kind, op.Key, op.Endpoint, limitText(op), status)
	}
}

func limitText(op history.Op) string {
	if op.Kind == history.OpRules {
		return fmt.Sprintf(" limit %d", op.Limit)
	}
	return ""
}

// final makes the last operator changes after the heal — the ops rule's
// limit and a new blocklist entry — and times each on every gateway,
// from the operator API's answer until the gateway enforces it (peeks
// through the check API).
func (o *operator) final(ctx context.Context, c *client) error {
	var errs []error
	for _, change := range []struct {
		measure string
		do      func() history.Op
		done    func(a history.Answer) bool
		key     string
		ep      string
	}{
		{"rules", func() history.Op { return o.setOpsLimit(ctx, finalOpsRule, true) },
			func(a history.Answer) bool { return a.Limit == finalOpsRule }, probeKey, opsEndpoint},
		{"blocklist", func() history.Op {
			body, _ := json.Marshal(map[string]string{"ttl": "1h", "reason": "chaos: the last change"})
			k := o.f.key(finalKey)
			return o.send(ctx, history.Op{Kind: history.OpBlock, Key: k.Name, TTL: time.Hour.Microseconds(), Final: true},
				http.MethodPut, "blocklist/"+keyPath(k), "application/json", body)
		}, func(a history.Answer) bool { return a.Status == 403 }, finalKey, "/s/fw"},
	} {
		var op history.Op
		for range 5 { // an aggregator just back may need a moment
			if op = change.do(); op.Succeeded() {
				break
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(time.Second):
			}
		}
		if !op.Succeeded() {
			errs = append(errs, fmt.Errorf("the last %s change failed: %d %s", change.measure, op.Status, op.Err))
			for _, g := range o.f.gws {
				o.rec.probe(history.Probe{What: "propagation", Target: g.name, Measure: change.measure, OK: false, Detail: "the change was refused: " + op.Err})
			}
			continue
		}
		k := o.f.key(change.key)
		var wg sync.WaitGroup
		for _, g := range o.f.gws {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := history.Probe{What: "propagation", Target: g.name, Measure: change.measure}
				deadline := time.Now().Add(propWait)
				for time.Now().Before(deadline) && ctx.Err() == nil {
					a := c.do(ctx, g, history.SurfaceCheck, k, change.ep, 0)
					o.rec.answer(a)
					if change.done(a) {
						p.OK, p.Took = true, max(0, a.Recv-op.Done)
						break
					}
					p.Detail = fmt.Sprintf("last answer %d limit %d %s", a.Status, a.Limit, a.Err)
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
				}
				o.rec.probe(p)
			}()
		}
		wg.Wait()
	}
	return errors.Join(errs...)
}

// politeUnpenalised asks for every polite key's penalty state: level 0
// and no history.
func (o *operator) politeUnpenalised(ctx context.Context) {
	for i := range o.f.keys {
		k := &o.f.keys[i]
		if !k.Polite {
			continue
		}
		p := history.Probe{What: "polite-penalty", Target: k.Name}
		a, err := o.liveAggregator()
		if err != nil {
			p.Detail = err.Error()
			o.rec.probe(p)
			continue
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.api+"/admin/v1/penalties/"+keyPath(k), nil)
		req.Header.Set("Authorization", "Bearer "+o.f.token)
		resp, err := o.http.Do(req)
		if err != nil {
			p.Detail = shortErr(err)
			o.rec.probe(p)
			continue
		}
		var st struct {
			Level   int               `json:"level"`
			History []json.RawMessage `json:"history"`
		}
		err = json.NewDecoder(resp.Body).Decode(&st)
		resp.Body.Close()
		switch {
		case err != nil:
			p.Detail = "penalty state: " + err.Error()
		case st.Level != 0 || len(st.History) != 0:
			p.Detail = fmt.Sprintf("level %d, %d steps in its history", st.Level, len(st.History))
		default:
			p.OK = true
		}
		o.rec.probe(p)
	}
}
