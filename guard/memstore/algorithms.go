package memstore

import (
	"strconv"
	"strings"
)

// Each algorithm below mirrors its Lua script line for line in meaning, in
// exact int64 arithmetic. See the scripts' headers for the state layout.

type tokenBucket struct{ bucket }

func (tokenBucket) load(w *work, st *state, now int64) {
	if st == nil {
		w.z, w.ts = 0, now
		return
	}
	z, ts := st.z, st.ts
	if st.s > 0 && st.s != w.a {
		z = cdiv(z*w.a, st.s)
	}
	if now > ts {
		if e := fdiv(now-ts, w.k); e > 0 {
			if e >= cdiv(z, w.b) {
				z = 0
			} else {
				z -= e * w.b
			}
			ts += e * w.k
		}
	}
	w.z, w.ts = z, ts
}

func (tokenBucket) save(w *work, now int64) *state {
	if w.z <= 0 {
		return nil
	}
	return &state{z: w.z, ts: w.ts, s: w.a, expires: w.ts + cdiv(w.z, w.b)*w.k}
}

type gcraAlg struct{ bucket }

func (gcraAlg) load(w *work, st *state, now int64) {
	w.z, w.ts = 0, now
	if st != nil && st.tat > now {
		w.z = cdiv(st.tat-now, w.k) * w.b
	}
}

// gcra keeps its debt on the tick grid, as stored (see bucket.lua).
func (gcraAlg) round(w *work) { w.z = cdiv(w.z, w.b) * w.b }

func (g gcraAlg) add(w *work, cost int64, capped bool, now int64) string {
	tok := g.bucket.add(w, cost, capped, now)
	g.round(w)
	return tok
}

func (g gcraAlg) sub(w *work, n int64) {
	g.bucket.sub(w, n)
	g.round(w)
}

func (g gcraAlg) refund(w *work, token string, lim int64) {
	g.bucket.refund(w, token, lim)
	g.round(w)
}

func (gcraAlg) save(w *work, now int64) *state {
	if w.z <= 0 {
		return nil
	}
	tat := now + cdiv(w.z, w.b)*w.k
	return &state{tat: tat, expires: tat}
}

// bucket holds what token_bucket and gcra share.
type bucket struct{}

func (bucket) fits(w *work, cost int64) bool { return w.z+cost*w.a <= w.L*w.a }

func (bucket) add(w *work, cost int64, capped bool, _ int64) string {
	w.z += cost * w.a
	if capped && w.z > 2*w.L*w.a {
		w.z = 2 * w.L * w.a
	}
	return itoa(cost)
}

func (bucket) sub(w *work, n int64) { w.z = max(w.z-n*w.a, 0) }

func (b bucket) refund(w *work, token string, lim int64) {
	if n, err := strconv.ParseInt(token, 10, 64); err == nil && n > 0 {
		if lim > 0 {
			n = min(n, lim)
		}
		b.sub(w, n)
	}
}

func (bucket) free(w *work) int64 { return fdiv(w.L*w.a-w.z, w.a) }

func (bucket) until(w *work, now, target int64) int64 {
	need := w.z - target*w.a
	if need <= 0 {
		return 0
	}
	return max(w.ts+cdiv(need, w.b)*w.k-now, 0)
}

func (b bucket) stats(w *work, now, cost int64) (rem, reset, next, retry int64) {
	rem = fdiv(w.L*w.a-w.z, w.a)
	if rem < w.L {
		next = b.until(w, now, w.L-rem-1)
	}
	return rem, b.until(w, now, 0), next, b.until(w, now, w.L-cost)
}

type fixedWindow struct{}

func (fixedWindow) load(w *work, st *state, now int64) {
	w.ws, w.n = fdiv(now, w.w)*w.w, 0
	if st != nil && st.ws == w.ws {
		w.n = st.n
	}
}

func (fixedWindow) save(w *work, _ int64) *state {
	if w.n <= 0 {
		return nil
	}
	return &state{ws: w.ws, n: w.n, expires: w.ws + w.w}
}

func (fixedWindow) fits(w *work, cost int64) bool { return w.n+cost <= w.L }

func (fixedWindow) add(w *work, cost int64, capped bool, _ int64) string {
	w.n += cost
	if capped && w.n > 2*w.L {
		w.n = 2 * w.L
	}
	return itoa(w.ws) + ":" + itoa(cost)
}

func (fixedWindow) sub(w *work, n int64) { w.n = max(w.n-n, 0) }

func (f fixedWindow) refund(w *work, token string, lim int64) {
	ws, n, ok := splitToken(token)
	if ok && ws == w.ws {
		if lim > 0 {
			n = min(n, lim)
		}
		f.sub(w, n)
	}
}

func (fixedWindow) free(w *work) int64 { return w.L - w.n }

func (fixedWindow) stats(w *work, now, cost int64) (rem, reset, next, retry int64) {
	rem = w.L - w.n
	wait := w.ws + w.w - now
	if w.n > 0 {
		reset, next = wait, wait
	}
	if w.n+cost > w.L {
		retry = wait
	}
	return rem, reset, next, retry
}

// splitToken parses "<int>:<non-negative int>".
func splitToken(tok string) (a, b int64, ok bool) {
	x, y, found := strings.Cut(tok, ":")
	if !found || y == "" || y[0] == '-' || y[0] == '+' {
		return 0, 0, false
	}
	a, err1 := strconv.ParseInt(x, 10, 64)
	b, err2 := strconv.ParseInt(y, 10, 64)
	return a, b, err1 == nil && err2 == nil && x[0] != '+'
}

type slidingCounter struct{}

func (slidingCounter) load(w *work, st *state, now int64) {
	w.t = fdiv(now, w.q)
	w.i = fdiv(w.t, w.sw)
	w.cnt = make(map[int64]int64, w.P+1)
	if st != nil {
		for j, n := range st.cnt {
			if j >= w.i-w.P && j <= w.i {
				w.cnt[j] = n
			}
		}
	}
}

func (slidingCounter) sum(w *work, k int64) int64 {
	var s int64
	for j := k - w.P + 1; j <= k; j++ {
		s += w.cnt[j]
	}
	return s
}

func (sc slidingCounter) est(w *work, t int64) int64 {
	k := fdiv(t, w.sw)
	return sc.sum(w, k)*w.sw + ((k+1)*w.sw-t)*w.cnt[k-w.P]
}

func (sc slidingCounter) fits(w *work, cost int64) bool {
	return sc.est(w, w.t)+cost*w.sw <= w.L*w.sw
}

func (sc slidingCounter) add(w *work, cost int64, capped bool, _ int64) string {
	if capped {
		cost = min(cost, fdiv(2*w.L*w.sw-sc.est(w, w.t), w.sw))
	}
	if cost <= 0 {
		return ""
	}
	w.cnt[w.i] += cost
	return itoa(w.i) + ":" + itoa(cost)
}

func (slidingCounter) sub(w *work, n int64) {
	for j := w.i; j >= w.i-w.P && n > 0; j-- {
		if have := w.cnt[j]; have > 0 {
			take := min(have, n)
			w.cnt[j] -= take
			n -= take
		}
	}
}

func (slidingCounter) refund(w *work, token string, lim int64) {
	j, n, ok := splitToken(token)
	if !ok || j < w.i-w.P || j > w.i {
		return
	}
	if lim > 0 {
		n = min(n, lim)
	}
	if n = min(n, w.cnt[j]); n > 0 {
		w.cnt[j] -= n
	}
}

func (slidingCounter) last(w *work) (int64, bool) {
	for j := w.i; j >= w.i-w.P; j-- {
		if w.cnt[j] > 0 {
			return j, true
		}
	}
	return 0, false
}

func (sc slidingCounter) save(w *work, _ int64) *state {
	last, ok := sc.last(w)
	if !ok {
		return nil
	}
	cnt := make(map[int64]int64, len(w.cnt))
	for j, n := range w.cnt {
		if n > 0 {
			cnt[j] = n
		}
	}
	return &state{cnt: cnt, expires: (last + w.P + 1) * w.sw * w.q}
}

func (sc slidingCounter) until(w *work, now, target int64) int64 {
	lim := target * w.sw
	for k := w.i; k <= w.i+w.P+1; k++ {
		start := max(k*w.sw, w.t)
		sum := sc.sum(w, k)
		if sum*w.sw > lim {
			continue
		}
		tau := start
		if prev := w.cnt[k-w.P]; prev > 0 {
			tau = max(tau, (k+1)*w.sw-fdiv(lim-sum*w.sw, prev))
		}
		if tau < (k+1)*w.sw {
			return max(tau*w.q-now, 0)
		}
	}
	return 0
}

func (sc slidingCounter) free(w *work) int64 { return fdiv(w.L*w.sw-sc.est(w, w.t), w.sw) }

func (sc slidingCounter) stats(w *work, now, cost int64) (rem, reset, next, retry int64) {
	rem = fdiv(w.L*w.sw-sc.est(w, w.t), w.sw)
	if last, ok := sc.last(w); ok {
		reset = max((last+w.P+1)*w.sw*w.q-now, 0)
	}
	if rem < w.L {
		next = sc.until(w, now, w.L-rem-1)
	}
	return rem, reset, next, sc.until(w, now, w.L-cost)
}

type slidingLog struct{}

func (slidingLog) load(w *work, st *state, now int64) {
	w.log, w.u = nil, 0
	if st == nil {
		return
	}
	for _, e := range st.log {
		if e.ts > now-w.w {
			w.log = append(w.log, e)
			w.u += e.n
		}
	}
}

func (slidingLog) insert(w *work, ts, n int64) string {
	var seq int64
	for _, e := range w.log {
		if e.ts == ts && e.seq > seq {
			seq = e.seq
		}
	}
	seq++
	e := entry{ts: ts, seq: seq, n: n, m: itoa(ts) + ":" + itoa(seq) + ":" + itoa(n)}
	pos := len(w.log)
	for i, o := range w.log {
		if o.ts > ts || (o.ts == ts && o.m > e.m) {
			pos = i
			break
		}
	}
	w.log = append(w.log, entry{})
	copy(w.log[pos+1:], w.log[pos:])
	w.log[pos] = e
	w.u += n
	return e.m
}

func (slidingLog) remove(w *work, i int) entry {
	e := w.log[i]
	w.log = append(w.log[:i:i], w.log[i+1:]...)
	w.u -= e.n
	return e
}

func (slidingLog) fits(w *work, cost int64) bool { return w.u+cost <= w.L }

func (sl slidingLog) add(w *work, cost int64, capped bool, now int64) string {
	if capped && w.u+cost > 2*w.L {
		cost = 2*w.L - w.u
	}
	if cost <= 0 {
		return ""
	}
	return sl.insert(w, now, cost)
}

func (sl slidingLog) sub(w *work, n int64) {
	for n > 0 && len(w.log) > 0 {
		e := sl.remove(w, 0)
		if e.n <= n {
			n -= e.n
			continue
		}
		sl.insert(w, e.ts, e.n-n)
		n = 0
	}
}

// free is 0: a log's charges are refunded whole, so no lease (which gives
// back part of a charge) is granted on it.
func (slidingLog) free(*work) int64 { return 0 }

func (sl slidingLog) refund(w *work, token string, _ int64) {
	for i, e := range w.log {
		if e.m == token {
			sl.remove(w, i)
			return
		}
	}
}

func (slidingLog) save(w *work, _ int64) *state {
	if len(w.log) == 0 {
		return nil
	}
	log := append([]entry(nil), w.log...)
	return &state{log: log, expires: log[len(log)-1].ts + w.w}
}

func (slidingLog) until(w *work, now, target int64) int64 {
	acc := w.u
	if acc <= target {
		return 0
	}
	for _, e := range w.log {
		acc -= e.n
		if acc <= target {
			return max(e.ts+w.w-now, 0)
		}
	}
	return 0
}

func (sl slidingLog) stats(w *work, now, cost int64) (rem, reset, next, retry int64) {
	rem = w.L - w.u
	if rem < w.L {
		next = sl.until(w, now, w.L-rem-1)
	}
	return rem, sl.until(w, now, 0), next, sl.until(w, now, w.L-cost)
}
