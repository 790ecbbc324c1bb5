package chaos

import (
	"context"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tollgate/tollgate/internal/service"
	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// weighted is an endpoint and its share of a key's requests.
type weighted struct {
	endpoint string
	weight   float64
}

// The hot keys' endpoints: hot1 keys mostly on the fast path (hot enough
// on each gateway to be given leases), hot2 keys on the strict rules, the
// tenant rule and the ops rule.
var (
	hot1Endpoints = []weighted{{"/f/tb", 0.4}, {"/f/gcra", 0.3}, {"/f/fw", 0.1}, {"/f/swc", 0.1}, {"/f/swl", 0.1}}
	hot2Endpoints = []weighted{{"/s/tb", 0.13}, {"/s/fw", 0.13}, {"/s/swl", 0.13}, {"/s/swc", 0.13}, {"/s/gcra", 0.13},
		{"/t/x", 0.2}, {opsEndpoint, 0.15}}
	// Polite keys stay far under the limits of their own counters.
	politeEndpoints = []string{"/s/tb", "/s/fw", "/f/fw", "/f/tb", "/s/gcra"}
	surfaces        = []string{history.SurfaceProxy, history.SurfaceCheck, history.SurfaceRLS}
)

// Load shape: a hot key alternates between phases of twice and a fifth
// its share, each 5 to 15 s of scheduled time, so that counters fill and
// refill; a polite key sends one request every politeGap.
const (
	politeGap   = time.Second
	maxInFlight = 512
)

// load is the open-loop generator: request i is due at start + i/rate,
// whatever happened to the ones before, with its key, endpoint, surface
// and gateway drawn from the seed.
type load struct {
	f    *fleet
	c    *client
	rec  *recorder
	rate float64
	seed uint64

	missed atomic.Int64
	wg     sync.WaitGroup
}

// hotKey is a hot key's schedule of phases.
type hotKey struct {
	key       *history.Key
	endpoints []weighted
	factor    float64       // current phase's weight
	until     time.Duration // end of the current phase, scheduled time
}

// run sends the load until ctx is done, then waits for the requests in
// flight (each bounded by the client's deadline).
func (l *load) run(ctx context.Context) {
	rng := rand.New(rand.NewPCG(l.seed, 0x10ad))
	var hot []*hotKey
	var polite []*history.Key
	for i := range l.f.keys {
		k := &l.f.keys[i]
		switch {
		case k.Polite:
			polite = append(polite, k)
		case len(k.Name) > 4 && k.Name[len(k.Name)-4:] == "hot1":
			hot = append(hot, &hotKey{key: k, endpoints: hot1Endpoints})
		case len(k.Name) > 4 && k.Name[len(k.Name)-4:] == "hot2":
			hot = append(hot, &hotKey{key: k, endpoints: hot2Endpoints})
		}
	}
	for _, k := range polite {
		l.wg.Add(1)
		go func() { defer l.wg.Done(); l.polite(ctx, k, rng.Uint64()) }()
	}
	// Requests in flight when the load stops run to their deadline:
	// cut short, their answers would be lost to the history.
	reqCtx := context.WithoutCancel(ctx)
	sem := make(chan struct{}, maxInFlight)
	start := time.Now()
	t := time.NewTimer(0)
	defer t.Stop()
	for i := int64(0); ; i++ {
		due := time.Duration(float64(i) / l.rate * float64(time.Second))
		t.Reset(time.Until(start.Add(due)))
		if !service.Wait(ctx, t.C) {
			l.wg.Wait()
			return
		}
		// Draw everything first, so the sequence of choices depends on
		// the seed alone.
		var total float64
		for _, h := range hot {
			if due >= h.until {
				h.factor = []float64{2, 0.2}[rng.IntN(2)]
				h.until = due + 5*time.Second + time.Duration(rng.Int64N(int64(10*time.Second)))
			}
			total += h.factor
		}
		pick := rng.Float64() * total
		h := hot[len(hot)-1]
		for _, x := range hot {
			if pick < x.factor {
				h = x
				break
			}
			pick -= x.factor
		}
		ep := h.endpoints[len(h.endpoints)-1].endpoint
		pe := rng.Float64()
		for _, w := range h.endpoints {
			if pe < w.weight {
				ep = w.endpoint
				break
			}
			pe -= w.weight
		}
		surface := surfaces[rng.IntN(len(surfaces))]
		g := l.f.gws[rng.IntN(len(l.f.gws))]
		select {
		case sem <- struct{}{}:
		default:
			l.missed.Add(1)
			continue
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			defer func() { <-sem }()
			l.rec.answer(l.c.do(reqCtx, g, surface, h.key, ep, 1))
		}()
	}
}

// polite sends one request every politeGap to one of its endpoints and,
// after a 429, waits out its Retry-After (plus a margin) before the next.
func (l *load) polite(ctx context.Context, k *history.Key, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x901e))
	t := time.NewTimer(politeGap)
	defer t.Stop()
	for service.Wait(ctx, t.C) {
		g := l.f.gws[rng.IntN(len(l.f.gws))]
		a := l.c.do(context.WithoutCancel(ctx), g, surfaces[rng.IntN(len(surfaces))], k, politeEndpoints[rng.IntN(len(politeEndpoints))], 1)
		l.rec.answer(a)
		wait := politeGap
		if a.Status == 429 {
			wait = max(wait, time.Duration(max(a.RetryAfter, 1))*time.Second+200*time.Millisecond)
		}
		t.Reset(wait)
	}
}
