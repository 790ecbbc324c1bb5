package checker

import (
	"cmp"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/tollgate/tollgate/loadtest/internal/chaos/history"
)

// forever is the end of a fault that never healed.
const forever = math.MaxInt64 / 4

// interval is [From, To] in µs.
type interval struct{ From, To history.Micros }

func (iv interval) overlaps(lo, hi history.Micros) bool { return iv.From <= hi && iv.To >= lo }

// faultEnd is when f healed, or forever.
func faultEnd(f *history.Fault) history.Micros {
	if f.End == 0 {
		return forever
	}
	return f.End
}

// gatewayIndex reads "gw3" as 3; 0 when name is not a gateway.
func gatewayIndex(name string) int {
	n, err := strconv.Atoi(strings.TrimPrefix(name, "gw"))
	if err != nil || !strings.HasPrefix(name, "gw") {
		return 0
	}
	return n
}

// onRedisData reports whether f can take Redis away from every gateway:
// a fault of the primary, whose loss or pause fails checks over until a
// failover or its return.
func onRedisData(f *history.Fault) bool {
	return f.Kind == "redis-kill" || f.Kind == "redis-stop"
}

// losesData reports whether f can lose Redis's counters or split its
// primary: the primary killed (restarted empty) or paused (a failover),
// the replica killed (it restarts empty; promoted before its resync it
// would lose everything), or a link of the replication or of the
// sentinels faulted (a failover the primary did not take part in).
func losesData(f *history.Fault) bool {
	switch f.Kind {
	case "redis-kill", "redis-stop", "replica-kill":
		return true
	}
	if f.Link != nil && f.Link.Server == "redis" {
		c := f.Link.Client
		return strings.HasPrefix(c, "redis-") || strings.HasPrefix(c, "sentinel-")
	}
	return false
}

// failsOpen reports whether f can make gateway gw decide without Redis.
func failsOpen(f *history.Fault, gw int) bool {
	if onRedisData(f) || losesData(f) {
		return true
	}
	return f.Link != nil && f.Link.Server == "redis" && gatewayIndex(f.Link.Client) == gw
}

// reachesNATS reports whether f can keep a gateway from hearing of an
// operator change: NATS down or paused, a gateway's NATS link faulted, a
// gateway paused, killed or restarted (it catches up once back).
func reachesNATS(f *history.Fault) bool {
	switch {
	case strings.HasPrefix(f.Kind, "nats-"), strings.HasPrefix(f.Kind, "gw-"):
		return true
	case f.Link != nil && f.Link.Server == "nats":
		return true
	}
	return false
}

// gatewayDown reports whether f keeps gateway gw from answering: paused,
// killed or restarting.
func gatewayDown(f *history.Fault, gw int) bool {
	return strings.HasPrefix(f.Kind, "gw-") && gatewayIndex(f.Target) == gw
}

// effects holds the fault windows the checker derives from a history.
type effects struct {
	// failOpen[gw] are the windows in which gateway gw may decide
	// degraded: each Redis fault from its start to its heal plus the
	// fail-open tail.
	failOpen map[int][]interval
	// dataLoss are the windows of faults that may lose or split Redis's
	// counters, to the heal plus the tail.
	dataLoss []interval
	// natsOut are windows in which a gateway may not hear of a change.
	natsOut []interval
	// down[gw] are windows in which gateway gw does not answer, to the
	// heal plus the recovery bound.
	down map[int][]interval
	// restarts[gw] are the times gateway gw started afresh (its local
	// limiters empty).
	restarts map[int][]history.Micros
	// stalls are the machine's stalls, to the stall tail.
	stalls []interval
}

func newEffects(h *history.History) *effects {
	m := h.Meta
	e := &effects{failOpen: map[int][]interval{}, down: map[int][]interval{}, restarts: map[int][]history.Micros{}}
	for i := range h.Faults {
		f := &h.Faults[i]
		if f.Start == 0 {
			continue // never applied
		}
		end := faultEnd(f)
		tail := min(end+m.FailOpenTail, forever)
		for gw := 1; gw <= m.Gateways; gw++ {
			if failsOpen(f, gw) {
				e.failOpen[gw] = append(e.failOpen[gw], interval{f.Start, tail})
			}
			if gatewayDown(f, gw) {
				e.down[gw] = append(e.down[gw], interval{f.Start, min(end+m.RecoveryBound, forever)})
				if f.Kind == "gw-kill" || f.Kind == "gw-restart" {
					e.restarts[gw] = append(e.restarts[gw], end)
				}
			}
		}
		if losesData(f) {
			e.dataLoss = append(e.dataLoss, interval{f.Start, tail})
		}
		if reachesNATS(f) {
			e.natsOut = append(e.natsOut, interval{f.Start, end})
		}
	}
	for _, ivs := range e.failOpen {
		sortIntervals(ivs)
	}
	for _, st := range h.Stalls {
		e.stalls = append(e.stalls, interval{st.Start, st.End + m.StallTail})
	}
	return e
}

// inStall reports whether [lo, hi] overlaps a stall of the machine.
func (e *effects) inStall(lo, hi history.Micros) bool {
	for _, iv := range e.stalls {
		if iv.overlaps(lo, hi) {
			return true
		}
	}
	return false
}

func sortIntervals(ivs []interval) {
	slices.SortFunc(ivs, func(a, b interval) int { return cmp.Compare(a.From, b.From) })
}

// inFailOpen reports whether an admission between lo and hi on gw lies in
// one of its fail-open windows.
func (e *effects) inFailOpen(gw int, lo, hi history.Micros) bool {
	for _, iv := range e.failOpen[gw] {
		if iv.From <= lo && hi <= iv.To {
			return true
		}
	}
	return false
}

// gatewayWasDown reports whether gw was paused, down or recovering at any
// time in [lo, hi].
func (e *effects) gatewayWasDown(gw int, lo, hi history.Micros) bool {
	for _, iv := range e.down[gw] {
		if iv.overlaps(lo, hi) {
			return true
		}
	}
	return false
}

// extendPastNATS returns the time an operator change made before t is
// surely known to every gateway, given the propagation bound: t + prop,
// pushed past every window in which a gateway could not hear of it.
func (e *effects) extendPastNATS(t, prop history.Micros) history.Micros {
	end := t + prop
	for changed := true; changed; {
		changed = false
		for _, iv := range e.natsOut {
			if iv.From <= end && iv.To >= t {
				if to := min(iv.To+prop, forever); to > end {
					end, changed = to, true
				}
			}
		}
	}
	return end
}
